"""The double-entry ledger in SQLite.

``ledger`` holds one row per entry (its ``seq`` from SQLite's rowid, never reused; its ``key`` unique; the entry as
JSON), ``ledger_lines`` one row per line (seq, account, amount), indexed by account: a ledger account's entries are an
index range, and balances one aggregate query, neither decoding any entry. An entry and its lines are written in one
transaction. The stored doc keeps the seq it was given (0, ignored): the row's seq is the one read back.
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import Any

from master.records import LedgerEntry
from master.store.aggregates import Aggregate
from master.store.entries import refuse_unbalanced
from master.store.sqlite.database import transaction
from master.store.sqlite.table import SqliteTable


class SqliteLedgerRepo(SqliteTable[LedgerEntry]):
    aggregate = Aggregate.LEDGER
    record_type = LedgerEntry

    async def post(self, entry: LedgerEntry) -> int | None:
        refuse_unbalanced(entry)
        doc = self._doc(entry.key, entry)
        lines = [(line.account, line.amount) for line in entry.lines]

        def post(conn: sqlite3.Connection) -> int | None:
            with transaction(conn):
                # OR IGNORE: an entry with this key is already there (perhaps posted by another Master): leave it.
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO ledger (key, rental, doc) VALUES (?, ?, ?)", (entry.key, entry.rental, doc)
                )
                if cursor.rowcount != 1:
                    return None
                seq = cursor.lastrowid
                conn.executemany(
                    "INSERT INTO ledger_lines (seq, account, amount) VALUES (?, ?, ?)", [(seq, a, n) for a, n in lines]
                )
                return seq

        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(post)

    async def get(self, key: str) -> LedgerEntry | None:
        return await self._select_one("SELECT key, doc, seq FROM ledger WHERE key = ?", (key,))

    async def list(
        self, *, account: str | None = None, rental: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> builtins.list[LedgerEntry]:
        if limit <= 0:
            return []
        conditions = ["seq > ?"]
        params: builtins.list[Any] = [after_seq]
        if rental is not None:
            conditions.append("rental = ?")
            params.append(rental)
        if account is not None:
            conditions.append("seq IN (SELECT seq FROM ledger_lines WHERE account = ? AND seq > ?)")
            params += [account, after_seq]
        clause = " AND ".join(conditions)
        return await self._select(f"SELECT key, doc, seq FROM ledger WHERE {clause} ORDER BY seq", params, limit=limit)

    async def balances(self) -> dict[str, int]:
        rows = await self._db.run(
            lambda conn: conn.execute("SELECT account, SUM(amount) FROM ledger_lines GROUP BY account").fetchall()
        )
        return {str(account): int(total) for account, total in rows}

    def _decode_row(self, row: tuple[Any, ...]) -> LedgerEntry:
        entry = self._decoder.decode(row[1])
        entry.seq = row[2]
        return entry
