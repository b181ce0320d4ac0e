"""Workload containers' kept output in MongoDB: one document per replica and attempt, ``_id`` its ``output_key``."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import KeptOutput
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection


class MongoOutputRepo(MongoCollection[KeptOutput]):
    aggregate = Aggregate.OUTPUTS
    record_type = KeptOutput

    async def put(self, rec: KeptOutput) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, key: str) -> KeptOutput | None:
        return await self._get(key)

    async def of_workload(self, workload_id: str) -> builtins.list[KeptOutput]:
        found = await self._find({"workload_id": workload_id}, [])
        return sorted(found, key=lambda r: (r.replica, r.attempt))

    async def pending(self, limit: int = 100) -> builtins.list[KeptOutput]:
        return await self._find({"state": "pending"}, [("ended_at", ASCENDING), ("_id", ASCENDING)], limit=limit)

    async def delete_before(self, ended_before: float) -> int:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_many({"state": {"$ne": "pending"}, "ended_at": {"$lt": ended_before}})
        return result.deleted_count
