"""Accounts in SQLite."""

from __future__ import annotations

import builtins
import sqlite3

from master.records import AccountRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteAccountRepo(SqliteTable[AccountRecord]):
    aggregate = Aggregate.ACCOUNTS
    record_type = AccountRecord

    async def add(self, rec: AccountRecord) -> bool:
        doc = self._doc(rec.id, rec)

        def insert(conn: sqlite3.Connection) -> bool:
            # OR IGNORE: a taken id is left as it is, and rowcount says whether this insert happened.
            cursor = conn.execute("INSERT OR IGNORE INTO accounts (id, role, doc) VALUES (?, ?, ?)", (rec.id, rec.role, doc))
            return cursor.rowcount == 1

        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(insert)

    async def put(self, rec: AccountRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO accounts (id, role, doc) VALUES (?, ?, ?)", rec.id, (rec.id, rec.role, self._doc(rec.id, rec))
        )

    async def get(self, account_id: str) -> AccountRecord | None:
        return await self._select_one("SELECT id, doc FROM accounts WHERE id = ?", (account_id,))

    async def list(self, *, role: str | None = None, after: str | None = None, limit: int = 1000) -> builtins.list[AccountRecord]:
        clause, params = where(("role = ?", role), ("id > ?", after))
        return await self._select(f"SELECT id, doc FROM accounts{clause} ORDER BY id", params, limit=limit)
