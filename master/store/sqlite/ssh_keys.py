"""Accounts' SSH public keys in SQLite (docs/ssh.md): one row per key, by id."""

from __future__ import annotations

import builtins

from master.records import SshKeyRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteSshKeyRepo(SqliteTable[SshKeyRecord]):
    aggregate = Aggregate.SSH_KEYS
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
