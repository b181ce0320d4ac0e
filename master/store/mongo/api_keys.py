"""API keys in MongoDB."""

from __future__ import annotations

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
