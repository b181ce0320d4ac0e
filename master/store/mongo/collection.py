"""What every MongoDB repository shares: its collection, the conversion of its record type, and the upkeep
of each read (document by document, the undecodable ones quarantined) and each write (refused if
unstorable, timed).

Documents are the records as builtins keyed by ``_id``. nx-27017 (the wire-compatible server the tests
run on) stores a top-level boolean written by ``$set`` into an existing document as 0/1, so documents
are read back with ``strict=False``, which turns 0/1 back into booleans (every other field keeps its type).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec
from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from master.store.aggregates import Aggregate
from master.store.codec import to_document
from master.store.metrics import StoreMetrics
from master.store.mongo.connection import MongoConnection
from master.store.quarantine import Quarantine

R = TypeVar("R", bound=msgspec.Struct)

Sort = list[tuple[str, int]]


def set_fields(doc: dict[str, Any]) -> dict[str, Any]:
    # An upsert by $set, not replace_one(..., upsert=True): nx-27017 inserts a fresh ObjectId for the latter.
    return {"$set": doc}


def only(**filters: Any) -> dict[str, Any]:
    """A query from the equality filters that are not None."""
    return {field: value for field, value in filters.items() if value is not None}


class MongoCollection(Generic[R]):
    aggregate: Aggregate
    record_type: type[R]

    def __init__(self, conn: MongoConnection, quarantine: Quarantine, metrics: StoreMetrics) -> None:
        self._conn = conn
        self._quarantine = quarantine
        self._metrics = metrics

    @property
    def _c(self) -> AsyncCollection[dict[str, Any]]:
        return self._conn.db[self.aggregate.value]

    # --- reading -------------------------------------------------------------------------------

    def _decode(self, doc: dict[str, Any]) -> R:
        return msgspec.convert(doc, self.record_type, strict=False)  # unknown keys such as _id are ignored

    def _key_of(self, doc: dict[str, Any]) -> object:
        return doc.get("_id")

    def _decoded(self, docs: Sequence[dict[str, Any]]) -> builtins.list[R]:
        """The records of ``docs``, those that fail to decode quarantined and skipped."""
        return self._quarantine.decode_each(self.aggregate, docs, self._decode, self._key_of)

    def _decode_or_quarantine(self, doc: dict[str, Any] | None) -> R | None:
        decoded = self._decoded([doc] if doc is not None else [])
        return decoded[0] if decoded else None

    async def _get(self, key: Any) -> R | None:
        return self._decode_or_quarantine(await self._c.find_one({"_id": key}))

    async def _find(self, query: dict[str, Any], sort: Sort, limit: int | None = None) -> builtins.list[R]:
        """The records ``query`` finds in ``sort`` order; with ``limit``, that many good ones if there are.

        Quarantined documents do not count against the limit: the page is topped up past them.
        """
        if limit is None:
            return self._decoded(await self._c.find(query, sort=sort).to_list())
        found: builtins.list[R] = []
        skip = 0
        while len(found) < limit:
            wanted = limit - len(found)
            docs = await self._c.find(query, sort=sort, skip=skip, limit=wanted).to_list()
            found += self._decoded(docs)
            skip += len(docs)
            if len(docs) < wanted:
                break
        return found

    # --- writing -------------------------------------------------------------------------------

    def _document(self, key: object, rec: R) -> dict[str, Any]:
        """The document to store for ``rec``; UnstorableRecord if it holds a NaN or an infinity."""
        return to_document(self.aggregate, key, rec)

    async def _upsert(self, key: Any, rec: R) -> None:
        doc = self._document(key, rec)
        with self._metrics.timed_write(self.aggregate):
            await self._c.update_one({"_id": key}, set_fields(doc), upsert=True)
        self._quarantine.release(self.aggregate, [key])

    async def _upsert_many(self, keyed: Sequence[tuple[Any, R]]) -> None:
        """Upsert ``(key, record)`` pairs in one round trip; nothing is written if one of them is unstorable."""
        if not keyed:
            return
        ops = [UpdateOne({"_id": key}, set_fields(self._document(key, rec)), upsert=True) for key, rec in keyed]
        with self._metrics.timed_write(self.aggregate):
            await self._c.bulk_write(ops, ordered=False)
        self._quarantine.release(self.aggregate, [key for key, _ in keyed])
