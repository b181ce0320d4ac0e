"""Accounts in MongoDB."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING
from pymongo.errors import DuplicateKeyError

from master.records import AccountRecord
from master.store.aggregates import Aggregate
from master.store.codec import Document
from master.store.mongo.collection import MongoCollection, only


class MongoAccountRepo(MongoCollection[AccountRecord]):
    aggregate = Aggregate.ACCOUNTS
    record_type = AccountRecord

    async def add(self, rec: AccountRecord) -> bool:
        doc = {"_id": rec.id, **self._document(rec.id, rec)}
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)  # _id is unique: of concurrent adds of one id, one inserts
        except DuplicateKeyError:
            return False
        self._quarantine.release(self.aggregate, [rec.id])
        return True

    async def put(self, rec: AccountRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, account_id: str) -> AccountRecord | None:
        return await self._get(account_id)

    async def list(self, *, role: str | None = None, after: str | None = None, limit: int = 1000) -> builtins.list[AccountRecord]:
        query: Document = only(role=role)
        if after is not None:
            query["_id"] = {"$gt": after}
        return await self._find(query, [("_id", ASCENDING)], limit=limit)
