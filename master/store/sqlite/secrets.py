"""Renters' secrets in SQLite, sealed (the value never in clear: master/secrets.py)."""

from __future__ import annotations

import builtins
import sqlite3

from master.records import SecretRecord
from master.store.aggregates import Aggregate, secret_key
from master.store.errors import DuplicateSecret
from master.store.sqlite.table import SqliteTable


class SqliteSecretRepo(SqliteTable[SecretRecord]):
    aggregate = Aggregate.SECRETS
    record_type = SecretRecord

    async def insert(self, rec: SecretRecord) -> None:
        key = secret_key(rec.account, rec.name)
        try:
            await self._write(
                "INSERT INTO secrets (id, account, name, doc) VALUES (?, ?, ?, ?)",
                None,
                (key, rec.account, rec.name, self._doc(key, rec)),
            )
        except sqlite3.IntegrityError:
            raise DuplicateSecret(f"secret {rec.name!r} already exists: delete it first to replace it") from None

    async def get(self, account: str, name: str) -> SecretRecord | None:
        return await self._select_one("SELECT id, doc FROM secrets WHERE id = ?", (secret_key(account, name),))

    async def list(self, account: str) -> builtins.list[SecretRecord]:
        return await self._select("SELECT id, doc FROM secrets WHERE account = ? ORDER BY name", (account,))

    async def delete(self, account: str, name: str) -> bool:
        key = secret_key(account, name)
        with self._metrics.timed_write(self.aggregate):
            gone = await self._db.run(lambda conn: conn.execute("DELETE FROM secrets WHERE id = ?", (key,)).rowcount)
        return bool(gone)
