"""Workload containers' kept output in MongoDB: one document per replica and attempt, ``_id`` its ``output_key``."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import KeptOutput
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoOutputRepo(MongoCollection[KeptOutput]):
    aggregate = Aggregate.OUTPUTS
    record_type = KeptOutput

    async def put(self, rec: KeptOutput) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, key: str) -> KeptOutput | None:
        return await self._get(key)

    async def list(
        self, *, workload_id: str | None = None, state: str | None = None, limit: int = 1000
    ) -> builtins.list[KeptOutput]:
        if limit <= 0:
            return []
        query = only(workload_id=workload_id, state=state)
        return await self._find(query, [("ended_at", ASCENDING), ("_id", ASCENDING)], limit=limit)

    async def delete_before(self, ended_before: float) -> int:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_many({"state": {"$ne": "pending"}, "ended_at": {"$lt": ended_before}})
        return result.deleted_count
