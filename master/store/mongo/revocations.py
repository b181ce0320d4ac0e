"""Certificate revocations in MongoDB."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import RevocationRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection


class MongoRevocationRepo(MongoCollection[RevocationRecord]):
    aggregate = Aggregate.REVOCATIONS
    record_type = RevocationRecord

    async def put(self, rec: RevocationRecord) -> None:
        await self._upsert(rec.serial, rec)

    async def list(self) -> builtins.list[RevocationRecord]:
        return await self._find({}, [("revoked_at", ASCENDING), ("_id", ASCENDING)])
