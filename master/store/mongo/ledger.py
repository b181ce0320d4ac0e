"""The double-entry ledger in MongoDB: one document per entry, ``_id`` its key, so posting it is one atomic insert
(all its lines or none; of concurrent posts of one key, one inserts) without a transaction (nx-27017's are not
isolated). ``seq`` comes from a counter in ``meta`` (a unique index), as events' do, and with the same caveat: with
several writers an entry may become visible after one with a higher seq. An account's entries are found through a
multikey index on ``lines.account``; balances are one aggregation.
"""

from __future__ import annotations

import builtins
from typing import Any

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from master.records import LedgerEntry
from master.store.aggregates import Aggregate
from master.store.entries import refuse_unbalanced
from master.store.mongo.collection import MongoCollection

_SEQ_COUNTER = "ledger_seq"


class MongoLedgerRepo(MongoCollection[LedgerEntry]):
    aggregate = Aggregate.LEDGER
    record_type = LedgerEntry

    async def _take_seq(self) -> int:
        counter = await self._conn.db.meta.find_one_and_update(
            {"_id": _SEQ_COUNTER}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert counter is not None
        return int(counter["value"])

    async def post(self, entry: LedgerEntry) -> int | None:
        refuse_unbalanced(entry)
        doc = self._document(entry.key, entry)  # refused before a seq is taken
        with self._metrics.timed_write(self.aggregate):
            if await self._c.find_one({"_id": entry.key}, projection={"_id": 1}) is not None:
                return None  # posted before: spend no seq on it
            seq = await self._take_seq()
            try:
                await self._c.insert_one({**doc, "_id": entry.key, "seq": seq})
            except DuplicateKeyError:
                return None  # posted meanwhile by another writer; its seq is the one in the ledger
        return seq

    async def get(self, key: str) -> LedgerEntry | None:
        return await self._get(key)

    async def list(
        self, *, account: str | None = None, rental: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> builtins.list[LedgerEntry]:
        if limit <= 0:
            return []
        query: dict[str, Any] = {"seq": {"$gt": after_seq}}
        if account is not None:
            query["lines.account"] = account
        if rental is not None:
            query["rental"] = rental
        return await self._find(query, [("seq", ASCENDING)], limit)

    async def balances(self) -> dict[str, int]:
        # $project between $unwind and $group: nx-27017 groups by a nested path of an unwound array as null.
        pipeline: builtins.list[dict[str, Any]] = [
            {"$unwind": "$lines"},
            {"$project": {"account": "$lines.account", "amount": "$lines.amount"}},
            {"$group": {"_id": "$account", "total": {"$sum": "$amount"}}},
        ]
        cursor = await self._c.aggregate(pipeline)
        return {str(doc["_id"]): int(doc["total"]) for doc in await cursor.to_list() if doc["_id"] is not None}
