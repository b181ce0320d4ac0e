"""GPUs in MongoDB."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from pymongo import ASCENDING

from master.records import GpuRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoGpuRepo(MongoCollection[GpuRecord]):
    aggregate = Aggregate.GPUS
    record_type = GpuRecord

    async def put_many(self, recs: Sequence[GpuRecord]) -> None:
        await self._upsert_many([(r.uuid, r) for r in recs])

    async def get(self, uuid: str) -> GpuRecord | None:
        return await self._get(uuid)

    async def list(
        self,
        *,
        agent_id: str | None = None,
        tier: str | None = None,
        state: str | None = None,
        model: str | None = None,
    ) -> builtins.list[GpuRecord]:
        query = only(agent_id=agent_id, tier=tier, state=state, model=model)
        return await self._find(query, [("agent_id", ASCENDING), ("index", ASCENDING), ("_id", ASCENDING)])
