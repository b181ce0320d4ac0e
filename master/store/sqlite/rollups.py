"""Telemetry rollups (one GPU, one minute) in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from master.records import TelemetryRollup
from master.store.aggregates import Aggregate, rollup_key
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteRollupRepo(SqliteTable[TelemetryRollup]):
    aggregate = Aggregate.ROLLUPS
    record_type = TelemetryRollup

    async def put_many(self, recs: Sequence[TelemetryRollup]) -> None:
        keyed = [(key := rollup_key(r.gpu_uuid, r.minute), (r.gpu_uuid, r.minute, self._doc(key, r))) for r in recs]
        await self._write_many("INSERT OR REPLACE INTO rollups (gpu_uuid, minute, doc) VALUES (?, ?, ?)", keyed)

    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]:
        clause, params = where(("gpu_uuid = ?", gpu_uuid), ("minute >= ?", since_minute), ("minute < ?", until_minute))
        return await self._select(f"SELECT gpu_uuid || ':' || minute, doc FROM rollups{clause} ORDER BY minute", params)
