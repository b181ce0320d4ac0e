"""What every MongoDB repository shares: its collection, the conversion of its record type, and the upkeep
of each read (document by document, the undecodable ones quarantined) and each write (refused if
unstorable, timed).

Documents are the records as builtins keyed by ``_id``. nx-27017 (the wire-compatible server the tests
run on) stores a top-level boolean written by ``$set`` into an existing document as 0/1, so documents
are read back with ``strict=False``, which turns 0/1 back into booleans (every other field keeps its type).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec
from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from common.errors import Fenced
from master.store.codec import Document, to_document
from master.store.metrics import StoreMetrics
from master.store.mongo.connection import MongoConnection
from master.store.quarantine import Quarantine

R = TypeVar("R", bound=msgspec.Struct)

Sort = list[tuple[str, int]]


def set_fields(doc: Document) -> Document:
    # An upsert by $set, not replace_one(..., upsert=True): nx-27017 inserts a fresh ObjectId for the latter.
    return {"$set": doc}


def only(**filters: Any) -> Document:
    """A query from the equality filters that are not None."""
    return {field: value for field, value in filters.items() if value is not None}


DUPLICATE_KEY = 11000


class MongoCollection(Generic[R]):
    aggregate: str  # an ``Aggregate``, or a plugged aggregate's name (master/store/plugin.py)
    record_type: type[R]
    # High availability (docs/ha.md): an upsert of this aggregate matches only a document no higher epoch wrote, so
    # a deposed leader's write that slipped past the fence is refused by the store itself (the contended aggregates).
    epoch_guarded = False

    def __init__(self, conn: MongoConnection, quarantine: Quarantine, metrics: StoreMetrics) -> None:
        self._conn = conn
        self._quarantine = quarantine
        self._metrics = metrics

    @property
    def _c(self) -> AsyncCollection[Document]:
        return self._conn.db[str(self.aggregate)]

    # --- reading -------------------------------------------------------------------------------

    def _decode(self, doc: Document) -> R:
        return msgspec.convert(doc, self.record_type, strict=False)  # unknown keys such as _id are ignored

    def _key_of(self, doc: Document) -> object:
        return doc.get("_id")

    def _decoded(self, docs: Sequence[Document]) -> builtins.list[R]:
        """The records of ``docs``, those that fail to decode quarantined and skipped."""
        return self._quarantine.decode_each(self.aggregate, docs, self._decode, self._key_of)

    def _decode_or_quarantine(self, doc: Document | None) -> R | None:
        decoded = self._decoded([doc] if doc is not None else [])
        return decoded[0] if decoded else None

    async def _get(self, key: Any) -> R | None:
        return self._decode_or_quarantine(await self._c.find_one({"_id": key}))

    async def _find(self, query: Document, sort: Sort, limit: int | None = None) -> builtins.list[R]:
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

    def _document(self, key: object, rec: R) -> Document:
        """The document to store for ``rec``, stamped with its writer when this Master leads a group (docs/ha.md);
        UnstorableRecord if it holds a NaN or an infinity."""
        doc = to_document(self.aggregate, key, rec)
        writer = self._conn.writer
        if writer is not None:
            # When the write was issued: one on its way when a leader froze may land after its successor took over.
            doc["_holder"], doc["_epoch"], doc["_issued_at"] = writer.holder, writer.epoch, time.time()
        return doc

    def _guarded(self) -> bool:
        return self.epoch_guarded and self._conn.writer is not None

    def _guard(self, key: Any) -> Document:
        """``_id``, and, once this Master leads a group (docs/ha.md), "no higher epoch wrote it". No ``$or`` (for the
        documents no leader stamped yet): nx-27017 drops the ``_id`` equality beside an ``$or`` and writes whichever
        document matches the rest."""
        writer = self._conn.writer
        if writer is None:
            return {"_id": key}
        return {"_id": key, "_epoch": {"$lte": writer.epoch}}

    def _fenced(self, keys: object) -> Fenced:
        writer = self._conn.writer
        epoch = writer.epoch if writer is not None else 0
        return Fenced(f"{self.aggregate} {keys} were written by a leader newer than epoch {epoch}: this Master is deposed")

    async def _upsert(self, key: Any, rec: R) -> None:
        doc = self._document(key, rec)
        with self._metrics.timed_write(self.aggregate):
            if self.epoch_guarded:
                await self._replace(key, doc)
            else:
                await self._c.update_one({"_id": key}, set_fields(doc), upsert=True)
        self._quarantine.release(self.aggregate, [key])

    async def _replace(self, key: Any, doc: Document) -> None:
        """Write ``doc`` whole as document ``key`` (the contended aggregates: commands, agents).

        A replacement, or an insert when there is none, rather than a ``$set`` upsert: nx-27017 keeps a float set into
        an existing document to 15 digits only (a command's times, which its signature covers, would no longer verify
        when resent) and a boolean as 0/1, and mishandles ``replace_one(..., upsert=True)``. Guarded (``_guard``): a
        document a newer leader wrote is not replaced, the insert then clashes, and the write is refused (Fenced)."""
        if (await self._c.replace_one(self._guard(key), doc)).matched_count:
            return
        try:
            await self._c.insert_one({"_id": key, **doc})
            return
        except DuplicateKeyError:
            pass  # inserted concurrently, or there and not ours to replace
        if (await self._c.replace_one(self._guard(key), doc)).matched_count:
            return
        # Matching None (a missing field) is reliable on nx-27017 next to an _id equality, as here.
        if self._guarded() and (await self._c.replace_one({"_id": key, "_epoch": None}, doc)).matched_count:
            return  # written before any leader stamped it (before high availability, or by provisioning)
        raise self._fenced([key])

    async def _upsert_many(self, keyed: Sequence[tuple[Any, R]]) -> None:
        """Upsert ``(key, record)`` pairs in one round trip (two for the contended aggregates: which exist, then the
        writes); nothing is written if one of them is unstorable."""
        if not keyed:
            return
        docs = [(key, self._document(key, rec)) for key, rec in keyed]
        with self._metrics.timed_write(self.aggregate):
            if self.epoch_guarded:
                await self._replace_many(docs)
            else:
                ops = [UpdateOne({"_id": key}, set_fields(doc), upsert=True) for key, doc in docs]
                await self._c.bulk_write(ops, ordered=False)
        self._quarantine.release(self.aggregate, [key for key, _ in keyed])

    async def _replace_many(self, docs: Sequence[tuple[Any, Document]]) -> None:
        """``_replace`` for many documents: replacements of those there, inserts of the others, in one bulk write;
        whatever it could not settle (an insert that clashed, a replacement that matched nothing) one by one."""
        keys = [key for key, _ in docs]
        there = {d["_id"] for d in await self._c.find({"_id": {"$in": keys}}, projection={"_id": 1}).to_list()}
        ops: list[ReplaceOne[Document] | InsertOne[Document]] = [
            ReplaceOne(self._guard(key), doc) if key in there else InsertOne({"_id": key, **doc}) for key, doc in docs
        ]
        unsettled: list[tuple[Any, Document]] = []
        try:
            result = await self._c.bulk_write(ops, ordered=False)
            if result.matched_count < len(there):
                unsettled = [(key, doc) for key, doc in docs if key in there]
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(e.get("code") != DUPLICATE_KEY for e in errors):
                raise
            unsettled = [docs[e["index"]] for e in errors]
            if exc.details.get("nMatched", len(there)) < len(there):
                unsettled += [(key, doc) for key, doc in docs if key in there]
        for key, doc in unsettled:
            await self._replace(key, doc)
