"""Accounts' SSH public keys (docs/ssh.md), kept in the Master's store: one record per key, by id.

SQLite: ``ssh_keys (id, account, created_at, doc)``, indexed by ``(account, created_at)``; MongoDB: one document per
key, ``_id`` its id, indexed by ``(account, created_at)`` (schema version 12, master/store/migrations.py).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from master.port import SshKeyRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only, where

NAME = "ssh_keys"


class SshKeyRepo(Protocol):
    """Accounts' SSH public keys, keyed by id."""

    async def put(self, rec: SshKeyRecord) -> None:
        """Insert, or replace the key of the same id."""

    async def delete(self, key_id: str) -> bool:
        """Remove one key; False when there was none."""

    async def list(self, *, account: str | None = None) -> builtins.list[SshKeyRecord]:
        """Every key (of one account when given), by creation, then id."""


class SqliteSshKeyRepo(SqliteTable[SshKeyRecord]):
    aggregate = NAME
    record_type = SshKeyRecord

    async def put(self, rec: SshKeyRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO ssh_keys (id, account, created_at, doc) VALUES (?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.account, rec.created_at, self._doc(rec.id, rec)),
        )

    async def delete(self, key_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(lambda conn: conn.execute("DELETE FROM ssh_keys WHERE id = ?", (key_id,)).rowcount)
        self._quarantine.release(self.aggregate, [key_id])
        return bool(removed == 1)

    async def list(self, *, account: str | None = None) -> builtins.list[SshKeyRecord]:
        clause, params = where(("account = ?", account))
        return await self._select(f"SELECT id, doc FROM ssh_keys{clause} ORDER BY created_at, id", params)


class MongoSshKeyRepo(MongoCollection[SshKeyRecord]):
    aggregate = NAME
    record_type = SshKeyRecord

    async def put(self, rec: SshKeyRecord) -> None:
        await self._upsert(rec.id, rec)

    async def delete(self, key_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": key_id})
        self._quarantine.release(self.aggregate, [key_id])
        return result.deleted_count == 1

    async def list(self, *, account: str | None = None) -> builtins.list[SshKeyRecord]:
        return await self._find(only(account=account), [("created_at", ASCENDING), ("_id", ASCENDING)])


SSH_KEYS: AggregatePlugin[SshKeyRepo] = AggregatePlugin(NAME, SqliteSshKeyRepo, MongoSshKeyRepo)
