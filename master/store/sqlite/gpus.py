"""GPUs in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from master.records import GpuRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable

_UPSERT = "INSERT OR REPLACE INTO gpus (uuid, agent_id, idx, model, state, tier, doc) VALUES (?, ?, ?, ?, ?, ?, ?)"


class SqliteGpuRepo(SqliteTable[GpuRecord]):
    aggregate = Aggregate.GPUS
    record_type = GpuRecord

    async def put_many(self, recs: Sequence[GpuRecord]) -> None:
        await self._write_many(
            _UPSERT, [(r.uuid, (r.uuid, r.agent_id, r.index, r.model, r.state, r.tier, self._doc(r.uuid, r))) for r in recs]
        )

    async def get(self, uuid: str) -> GpuRecord | None:
        return await self._select_one("SELECT uuid, doc FROM gpus WHERE uuid = ?", (uuid,))

    async def list(
        self,
        *,
        agent_id: str | None = None,
        tier: str | None = None,
        state: str | None = None,
        model: str | None = None,
    ) -> builtins.list[GpuRecord]:
        clause, params = where(("agent_id = ?", agent_id), ("tier = ?", tier), ("state = ?", state), ("model = ?", model))
        return await self._select(f"SELECT uuid, doc FROM gpus{clause} ORDER BY agent_id, idx, uuid", params)
