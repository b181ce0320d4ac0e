"""API keys in MongoDB."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import ApiKeyRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection


class MongoApiKeyRepo(MongoCollection[ApiKeyRecord]):
    aggregate = Aggregate.API_KEYS
    record_type = ApiKeyRecord

    async def put(self, rec: ApiKeyRecord) -> None:
        await self._upsert(rec.key_hash, rec)

    async def get(self, key_hash: str) -> ApiKeyRecord | None:
        return await self._get(key_hash)

    async def mark_used(self, key_hash: str, when: float) -> None:
        with self._metrics.timed_write(self.aggregate):
            await self._c.update_one({"_id": key_hash}, {"$set": {"last_used": when}})  # no upsert: no key, no change

    async def by_key_id(self, key_id: str) -> ApiKeyRecord | None:
        if not key_id:
            return None
        found = await self._find({"key_id": key_id}, [("_id", ASCENDING)], limit=1)
        return found[0] if found else None

    async def list(self, *, subject: str) -> builtins.list[ApiKeyRecord]:
        return await self._find({"subject": subject}, [("created_at", ASCENDING), ("key_id", ASCENDING)])
