"""Requests to serverless endpoints (``EndpointRequestRecord``, management/endpoints/queue.py), in the Master's store:
inserted once (``DuplicateEndpointRequest``), then replaced only over the version the writer read
(``StaleEndpointRequest`` otherwise); listed by their FIFO ``order``. A Master that restarts loads the open ones
(``list(states=OPEN)``) and goes on where it was (docs/endpoints.md, "The request queue").

Each record is bounded: its input, output, partial outputs and progress are JSON text that the queue caps
(``QueueLimits``), and the repository refuses a record whose stored form is larger than ``MAX_RECORD_BYTES``
(``UnstorableRecord``) whatever the limits, so no request can grow a row or a document without bound (MongoDB's own
limit is 16 MiB).

An ended request is kept until the book's retention sweep deletes it (``delete_ended``, by when it ended).

SQLite: ``endpoint_requests (id, endpoint_id, state, ord, version, doc, ended)``, indexed by
``(state, endpoint_id, ord)``, ``(endpoint_id, ord)`` and ``ended``. MongoDB: one document per request, ``_id`` its
id, the record's fields beside it, indexed alike on ``state``, ``endpoint_id`` and ``order``, and on ``ended_at``.
Schema versions 16 and 17 (master/store/migrations.py).
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection, Sequence
from typing import Protocol

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from common.errors import Conflict
from management.endpoints.queue import EndpointRequestRecord
from master.store.kit import (
    AggregatePlugin,
    Document,
    MongoCollection,
    SqliteTable,
    UnstorableRecord,
    set_fields,
    transaction,
    where,
)

NAME = "endpoint_requests"
MAX_RECORD_BYTES = 8 << 20  # characters of payload; the default limits make at most about 3 Mi of them


class StaleEndpointRequest(Conflict):
    """A request write that named a version other than the stored one: someone else wrote it first. Read it again."""


class DuplicateEndpointRequest(Conflict):
    """A new request whose id is already stored."""


class EndpointRequestRepo(Protocol):
    """Endpoint requests; written with a version check, listed by ``order`` (ascending, then id)."""

    async def get(self, request_id: str) -> EndpointRequestRecord | None: ...

    async def insert(self, rec: EndpointRequestRecord) -> None:
        """Store a new request; DuplicateEndpointRequest if its id is taken."""

    async def update(self, rec: EndpointRequestRecord, *, expected_version: int) -> None:
        """Replace the stored request if its stored ``version`` is ``expected_version``, else StaleEndpointRequest
        (also when it is not stored). The caller sets ``rec.version``."""

    async def write_many(self, recs: Sequence[EndpointRequestRecord]) -> builtins.list[bool]:
        """Store several requests' new versions at once, in order (the book's group commit): a record at version 1 is
        inserted, any other replaces the stored one at its version less one. Answers, record by record, whether it was
        stored (False where ``insert`` would raise DuplicateEndpointRequest or ``update`` StaleEndpointRequest, or for
        an unstorable record); the others are stored, durably, when it returns. A failure of the store itself raises:
        on SQLite none of them is stored then (one transaction), on MongoDB those before it are."""

    async def list(
        self,
        *,
        endpoint_id: str | None = None,
        states: Collection[str] | None = None,
        after_order: int | None = None,
        limit: int = 1000,
    ) -> builtins.list[EndpointRequestRecord]:
        """Requests matching every filter, by ``order`` then id; an empty ``states`` matches none; ``after_order``:
        the ``order`` of the last one of the previous page."""

    async def delete_ended(self, before: float, *, limit: int = 1000) -> builtins.list[str]:
        """Delete up to ``limit`` requests that ended before ``before`` (oldest end first); their ids."""

    async def count_by_state(self, endpoint_id: str) -> dict[str, int]:
        """How many of the endpoint's requests are in each state (states with none left out)."""

    async def latest(self, endpoint_id: str, *, limit: int = 20) -> builtins.list[EndpointRequestRecord]:
        """The endpoint's last ``limit`` requests by their place in the queue, the newest first (a retry is new)."""


INSERT_SQL = "INSERT INTO endpoint_requests (id, endpoint_id, state, ord, version, doc, ended) VALUES (?, ?, ?, ?, ?, ?, ?)"
UPDATE_SQL = "UPDATE endpoint_requests SET state = ?, ord = ?, version = ?, doc = ?, ended = ? WHERE id = ? AND version = ?"


def _insert_row(rec: EndpointRequestRecord, doc: str) -> tuple[object, ...]:
    return (rec.id, rec.endpoint_id, rec.state, rec.order, rec.version, doc, rec.ended_at)


def payload_chars(rec: EndpointRequestRecord) -> int:
    """How much of the record is the renter's and the worker's: its JSON texts and error, in characters."""
    error = rec.error
    texts = (rec.input, rec.output, rec.progress, *(p.output for p in rec.partials))
    return sum(map(len, texts)) + (0 if error is None else len(error.type) + len(error.message) + len(error.traceback))


def refuse_unstorable(rec: EndpointRequestRecord) -> None:
    """UnstorableRecord for a record the repository would refuse (its payload past MAX_RECORD_BYTES)."""
    _refuse_oversized(rec)


def _refuse_oversized(rec: EndpointRequestRecord) -> None:
    if (size := payload_chars(rec)) > MAX_RECORD_BYTES:
        raise UnstorableRecord(f"endpoint request {rec.id!r} carries {size} characters, over {MAX_RECORD_BYTES}")


class SqliteEndpointRequestRepo(SqliteTable[EndpointRequestRecord]):
    aggregate = NAME
    record_type = EndpointRequestRecord

    async def get(self, request_id: str) -> EndpointRequestRecord | None:
        return await self._select_one("SELECT id, doc FROM endpoint_requests WHERE id = ?", (request_id,))

    async def insert(self, rec: EndpointRequestRecord) -> None:
        _refuse_oversized(rec)
        doc = self._doc(rec.id, rec)
        row = _insert_row(rec, doc)
        try:
            await self._write(INSERT_SQL, None, row)
        except sqlite3.IntegrityError:
            raise DuplicateEndpointRequest(f"endpoint request {rec.id!r} is already stored") from None

    async def update(self, rec: EndpointRequestRecord, *, expected_version: int) -> None:
        _refuse_oversized(rec)
        doc = self._doc(rec.id, rec)
        params = (rec.state, rec.order, rec.version, doc, rec.ended_at, rec.id, expected_version)
        with self._metrics.timed_write(self.aggregate):
            changed = await self._db.run(lambda conn: conn.execute(UPDATE_SQL, params).rowcount)
        if changed != 1:
            raise StaleEndpointRequest(
                f"endpoint request {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def write_many(self, recs: Sequence[EndpointRequestRecord]) -> builtins.list[bool]:
        if not recs:
            return []
        docs: builtins.list[str | None] = []
        for rec in recs:
            try:
                _refuse_oversized(rec)
                docs.append(self._doc(rec.id, rec))
            except UnstorableRecord:
                docs.append(None)

        def write(conn: sqlite3.Connection) -> builtins.list[bool]:
            stored: builtins.list[bool] = []
            with transaction(conn):  # one commit for them all: the WAL's write, once
                for rec, doc in zip(recs, docs, strict=True):
                    if doc is None:
                        stored.append(False)
                    elif rec.version == 1:
                        try:
                            conn.execute(INSERT_SQL, _insert_row(rec, doc))
                        except sqlite3.IntegrityError:  # that statement alone is undone; the transaction goes on
                            stored.append(False)
                        else:
                            stored.append(True)
                    else:
                        params = (rec.state, rec.order, rec.version, doc, rec.ended_at, rec.id, rec.version - 1)
                        stored.append(conn.execute(UPDATE_SQL, params).rowcount == 1)
            return stored

        with self._metrics.timed_write(self.aggregate):
            stored = await self._db.run(write)
        self._quarantine.release(self.aggregate, [rec.id for rec, ok in zip(recs, stored, strict=True) if ok and rec.version > 1])
        return stored

    async def list(
        self,
        *,
        endpoint_id: str | None = None,
        states: Collection[str] | None = None,
        after_order: int | None = None,
        limit: int = 1000,
    ) -> builtins.list[EndpointRequestRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clause, params = where(("endpoint_id = ?", endpoint_id), ("ord > ?", after_order))
        if states is not None:
            in_states = f"state IN ({', '.join('?' for _ in states)})"
            clause += f" AND {in_states}" if clause else f" WHERE {in_states}"
            params += builtins.list(states)
        return await self._select(f"SELECT id, doc FROM endpoint_requests{clause} ORDER BY ord, id", params, limit=limit)

    async def delete_ended(self, before: float, *, limit: int = 1000) -> builtins.list[str]:
        if limit <= 0:
            return []

        def delete(conn: sqlite3.Connection) -> builtins.list[str]:
            with conn:
                found = conn.execute(
                    "SELECT id FROM endpoint_requests WHERE ended < ? ORDER BY ended, id LIMIT ?", (before, limit)
                ).fetchall()
                ids = [row[0] for row in found]
                conn.executemany("DELETE FROM endpoint_requests WHERE id = ?", [(i,) for i in ids])
            return ids

        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(delete)

    async def count_by_state(self, endpoint_id: str) -> dict[str, int]:
        sql = "SELECT state, COUNT(*) FROM endpoint_requests WHERE endpoint_id = ? GROUP BY state"
        rows = await self._db.run(lambda conn: conn.execute(sql, (endpoint_id,)).fetchall())
        return {str(state): int(n) for state, n in rows}

    async def latest(self, endpoint_id: str, *, limit: int = 20) -> builtins.list[EndpointRequestRecord]:
        if limit <= 0:
            return []
        sql = "SELECT id, doc FROM endpoint_requests WHERE endpoint_id = ? ORDER BY ord DESC, id DESC"
        return await self._select(sql, (endpoint_id,), limit=limit)


class MongoEndpointRequestRepo(MongoCollection[EndpointRequestRecord]):
    aggregate = NAME
    record_type = EndpointRequestRecord

    def _request_document(self, rec: EndpointRequestRecord) -> Document:
        _refuse_oversized(rec)
        return self._document(rec.id, rec)

    async def get(self, request_id: str) -> EndpointRequestRecord | None:
        return await self._get(request_id)

    async def insert(self, rec: EndpointRequestRecord) -> None:
        doc = {"_id": rec.id} | self._request_document(rec)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)
        except DuplicateKeyError:
            raise DuplicateEndpointRequest(f"endpoint request {rec.id!r} is already stored") from None

    async def update(self, rec: EndpointRequestRecord, *, expected_version: int) -> None:
        doc = self._request_document(rec)
        with self._metrics.timed_write(self.aggregate):
            # One atomic document update: of two writers that read the same version, only the first matches.
            result = await self._c.update_one({"_id": rec.id, "version": expected_version}, set_fields(doc))
        if result.matched_count != 1:
            raise StaleEndpointRequest(
                f"endpoint request {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def write_many(self, recs: Sequence[EndpointRequestRecord]) -> builtins.list[bool]:
        # One write at a time, each acknowledged by the replica set as its own is (a version check per document has
        # no bulk form that tells which matched).
        stored: builtins.list[bool] = []
        for rec in recs:
            try:
                if rec.version == 1:
                    await self.insert(rec)
                else:
                    await self.update(rec, expected_version=rec.version - 1)
            except (DuplicateEndpointRequest, StaleEndpointRequest, UnstorableRecord):
                stored.append(False)
            else:
                stored.append(True)
        return stored

    async def list(
        self,
        *,
        endpoint_id: str | None = None,
        states: Collection[str] | None = None,
        after_order: int | None = None,
        limit: int = 1000,
    ) -> builtins.list[EndpointRequestRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        query: Document = {}
        if endpoint_id is not None:
            query["endpoint_id"] = endpoint_id
        if states is not None:
            query["state"] = {"$in": builtins.list(states)}
        if after_order is not None:
            query["order"] = {"$gt": after_order}
        return await self._find(query, [("order", ASCENDING), ("_id", ASCENDING)], limit)

    async def delete_ended(self, before: float, *, limit: int = 1000) -> builtins.list[str]:
        if limit <= 0:
            return []
        query: Document = {"ended_at": {"$lt": before}}
        found = self._c.find(query, {"_id": 1}).sort([("ended_at", ASCENDING), ("_id", ASCENDING)]).limit(limit)
        ids = [str(doc["_id"]) async for doc in found]
        if ids:
            with self._metrics.timed_write(self.aggregate):
                await self._c.delete_many({"_id": {"$in": ids}})
        return ids

    async def count_by_state(self, endpoint_id: str) -> dict[str, int]:
        pipeline: builtins.list[Document] = [
            {"$match": {"endpoint_id": endpoint_id}},
            {"$group": {"_id": "$state", "n": {"$sum": 1}}},
        ]
        cursor = await self._c.aggregate(pipeline)
        return {str(doc["_id"]): int(doc["n"]) for doc in await cursor.to_list() if doc["_id"] is not None}

    async def latest(self, endpoint_id: str, *, limit: int = 20) -> builtins.list[EndpointRequestRecord]:
        if limit <= 0:
            return []
        return await self._find({"endpoint_id": endpoint_id}, [("order", DESCENDING), ("_id", DESCENDING)], limit)


ENDPOINT_REQUESTS: AggregatePlugin[EndpointRequestRepo] = AggregatePlugin(
    NAME, SqliteEndpointRequestRepo, MongoEndpointRequestRepo
)
