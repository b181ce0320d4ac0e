"""Certificate revocations in SQLite."""

from __future__ import annotations

import builtins

from master.records import RevocationRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.table import SqliteTable


class SqliteRevocationRepo(SqliteTable[RevocationRecord]):
    aggregate = Aggregate.REVOCATIONS
    record_type = RevocationRecord

    async def put(self, rec: RevocationRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO revocations (serial, agent_id, revoked_at, doc) VALUES (?, ?, ?, ?)",
            rec.serial,
            (rec.serial, rec.agent_id, rec.revoked_at, self._doc(rec.serial, rec)),
        )

    async def list(self) -> builtins.list[RevocationRecord]:
        return await self._select("SELECT serial, doc FROM revocations ORDER BY revoked_at, serial")
