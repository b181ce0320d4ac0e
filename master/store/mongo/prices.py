"""Providers' prices in MongoDB: one document per (provider, agent_id), ``_id`` its ``aggregates.price_key``."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import PriceRecord
from master.store.aggregates import Aggregate, price_key
from master.store.mongo.collection import MongoCollection, only


class MongoPriceRepo(MongoCollection[PriceRecord]):
    aggregate = Aggregate.PRICES
    record_type = PriceRecord

    async def put(self, rec: PriceRecord) -> None:
        await self._upsert(price_key(rec.provider, rec.agent_id), rec)

    async def delete(self, provider: str, agent_id: str) -> bool:
        key = price_key(provider, agent_id)
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": key})
        self._quarantine.release(self.aggregate, [key])
        return result.deleted_count == 1

    async def list(self, *, provider: str | None = None) -> builtins.list[PriceRecord]:
        return await self._find(only(provider=provider), [("provider", ASCENDING), ("agent_id", ASCENDING)])
