"""The leader lease in MongoDB: one document in ``leader_lease``, changed only by compare-and-set.

Each change reads the document, then updates it with a filter on exactly what it read (holder, epoch,
expiry): of Masters racing, the first update matches and the others find the document changed and get
None. The very first lease is an insert of a fixed ``_id``, which the unique ``_id`` index lets only one
racer make. No upsert is used: nx-27017 mishandles ``replace_one(..., upsert=True)`` on ``_id``.

Not a record aggregate (no quarantine, no write metrics): a lease document that does not decode is a
broken deployment, reported as such.
"""

from __future__ import annotations

import msgspec
from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from master.records import LeaseRecord
from master.store.codec import Document
from master.store.mongo.connection import MongoConnection

COLLECTION = "leader_lease"
LEASE_ID = "leader"


class MongoLeaseRepo:
    def __init__(self, conn: MongoConnection) -> None:
        self._conn = conn

    @property
    def _c(self) -> AsyncCollection[Document]:
        return self._conn.db[COLLECTION]

    async def current(self) -> LeaseRecord | None:
        return _decode(await self._c.find_one({"_id": LEASE_ID}))

    async def acquire(self, holder: str, url: str, api_url: str, ttl_s: float, now: float) -> LeaseRecord | None:
        stored = await self.current()
        if stored is None:
            lease = LeaseRecord(holder=holder, url=url, api_url=api_url, epoch=1, expires_at=now + ttl_s)
            try:
                await self._c.insert_one({"_id": LEASE_ID, **msgspec.to_builtins(lease)})
            except DuplicateKeyError:
                return None  # another Master took the first lease meanwhile
            return lease
        if stored.holder != holder and stored.expires_at > now:
            return None
        epoch = stored.epoch if stored.holder == holder else stored.epoch + 1
        taken = await self._c.find_one_and_update(
            {"_id": LEASE_ID, "holder": stored.holder, "epoch": stored.epoch, "expires_at": stored.expires_at},
            {"$set": {"holder": holder, "url": url, "api_url": api_url, "epoch": epoch, "expires_at": now + ttl_s}},
            return_document=ReturnDocument.AFTER,
        )
        return _decode(taken)

    async def renew(self, holder: str, epoch: int, ttl_s: float, now: float) -> LeaseRecord | None:
        renewed = await self._c.find_one_and_update(
            {"_id": LEASE_ID, "holder": holder, "epoch": epoch},
            {"$set": {"expires_at": now + ttl_s}},
            return_document=ReturnDocument.AFTER,
        )
        return _decode(renewed)

    async def release(self, holder: str, epoch: int) -> bool:
        result = await self._c.update_one({"_id": LEASE_ID, "holder": holder, "epoch": epoch}, {"$set": {"expires_at": 0.0}})
        return result.matched_count == 1


def _decode(doc: Document | None) -> LeaseRecord | None:
    if doc is None:
        return None
    return msgspec.convert(doc, LeaseRecord, strict=False)
