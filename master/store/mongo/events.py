"""Events in MongoDB."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from pymongo import ASCENDING, ReturnDocument

from master.records import EventRecord
from master.store.aggregates import Aggregate
from master.store.base import prefix_upper_bound
from master.store.codec import Document
from master.store.mongo.collection import MongoCollection, only


class MongoEventRepo(MongoCollection[EventRecord]):
    """Events are keyed by their ``seq`` (a unique index), taken from a counter in ``meta``.

    nx-27017 cannot index ``_id`` inside a compound index, hence a ``seq`` of their own. Seqs increase in
    the order they are taken; with several writers an event may become visible after one with a higher
    seq, so a reader paging by ``after_seq`` can, rarely, step over it. Only the leader Master writes
    events, which keeps that window to its own concurrent appends.
    """

    aggregate = Aggregate.EVENTS
    record_type = EventRecord

    def _key_of(self, doc: Document) -> object:
        return doc.get("seq", doc.get("_id"))

    async def _take_seqs(self, count: int) -> int:
        """Reserve ``count`` seqs; returns the first."""
        counter = await self._conn.db.meta.find_one_and_update(
            {"_id": "event_seq"}, {"$inc": {"value": count}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert counter is not None
        return int(counter["value"]) - count + 1

    def _unnumbered(self, rec: EventRecord) -> Document:
        return self._document(f"{rec.kind} of {rec.subject}", rec)

    async def append(self, rec: EventRecord) -> int:
        doc = self._unnumbered(rec)  # refused before a seq is taken
        with self._metrics.timed_write(self.aggregate):
            seq = await self._take_seqs(1)
            await self._c.insert_one({**doc, "seq": seq})
        return seq

    async def append_many(self, recs: Sequence[EventRecord]) -> None:
        if not recs:
            return
        docs = [self._unnumbered(r) for r in recs]
        with self._metrics.timed_write(self.aggregate):
            first = await self._take_seqs(len(docs))
            await self._c.insert_many([{**doc, "seq": first + i} for i, doc in enumerate(docs)])

    async def list(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[EventRecord]:
        if limit <= 0:
            return []
        query: Document = {"seq": {"$gt": after_seq}, **only(subject=subject)}
        if kind_prefix:
            query["kind"] = {"$gte": kind_prefix, "$lt": prefix_upper_bound(kind_prefix)}
        return await self._find(query, [("seq", ASCENDING)], limit)
