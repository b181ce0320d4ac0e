"""Renters' workloads (``WorkloadRecord``), in the Master's store: inserted once (``DuplicateWorkload`` for a taken id), then
replaced only over the version the writer read (``StaleWorkload`` otherwise); listed newest first by
``workload_order(created_at, id)``.

SQLite: ``workloads (id, account, state, listed, version, doc)``, indexed by ``listed``, by account and by state;
MongoDB: one document per workload, ``_id`` its id, carrying ``listed`` beside the record's fields (the one field lists
sort and page on; decoding ignores it), indexed alike. Schema version 3 (master/store/migrations.py).
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection
from typing import Protocol

from pymongo import DESCENDING
from pymongo.errors import DuplicateKeyError

from common.errors import Conflict
from master.port import WorkloadRecord
from master.store.kit import AggregatePlugin, Document, MongoCollection, SqliteTable, only, set_fields, where

NAME = "workloads"


def workload_order(created_at: float, workload_id: str) -> str:
    """Where a workload sorts in lists, in both backends: by creation time, then id, as one comparable string."""
    return f"{created_at:020.6f}|{workload_id}"


class StaleWorkload(Conflict):
    """A workload write that named a version other than the stored one: someone else wrote it first. Read it again."""


class DuplicateWorkload(Conflict):
    """A new workload whose id is already stored."""


class WorkloadRepo(Protocol):
    """Renters' workloads; written with a version check (optimistic concurrency), listed newest first.

    The order of a list is ``workload_order(created_at, id)``, descending; ``before`` is such an
    order key (the last one of the previous page) and the list continues strictly after it.
    """

    async def get(self, workload_id: str) -> WorkloadRecord | None: ...

    async def insert(self, rec: WorkloadRecord) -> None:
        """Store a new workload; DuplicateWorkload if its id is taken."""

    async def update(self, rec: WorkloadRecord, *, expected_version: int) -> None:
        """Replace the stored workload if its stored ``version`` is ``expected_version``, else StaleWorkload
        (also when it is not stored at all). The caller sets ``rec.version`` (normally ``expected_version + 1``)."""

    async def list(
        self,
        *,
        account: str | None = None,
        states: Collection[str] | None = None,
        before: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[WorkloadRecord]:
        """Workloads matching every filter, newest first; an empty ``states`` matches none."""


class SqliteWorkloadRepo(SqliteTable[WorkloadRecord]):
    aggregate = NAME
    record_type = WorkloadRecord

    async def get(self, workload_id: str) -> WorkloadRecord | None:
        return await self._select_one("SELECT id, doc FROM workloads WHERE id = ?", (workload_id,))

    async def insert(self, rec: WorkloadRecord) -> None:
        row = (rec.id, rec.account, rec.state, workload_order(rec.created_at, rec.id), rec.version, self._doc(rec.id, rec))
        try:
            await self._write(
                "INSERT INTO workloads (id, account, state, listed, version, doc) VALUES (?, ?, ?, ?, ?, ?)", None, row
            )
        except sqlite3.IntegrityError:
            raise DuplicateWorkload(f"workload {rec.id!r} is already stored") from None

    async def update(self, rec: WorkloadRecord, *, expected_version: int) -> None:
        doc = self._doc(rec.id, rec)
        sql = "UPDATE workloads SET account = ?, state = ?, version = ?, doc = ? WHERE id = ? AND version = ?"
        params = (rec.account, rec.state, rec.version, doc, rec.id, expected_version)
        with self._metrics.timed_write(self.aggregate):
            changed = await self._db.run(lambda conn: conn.execute(sql, params).rowcount)
        if changed != 1:
            raise StaleWorkload(
                f"workload {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        states: Collection[str] | None = None,
        before: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[WorkloadRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clause, params = where(("account = ?", account), ("listed < ?", before))
        if states is not None:
            in_states = f"state IN ({', '.join('?' for _ in states)})"
            clause += f" AND {in_states}" if clause else f" WHERE {in_states}"
            params += builtins.list(states)
        return await self._select(f"SELECT id, doc FROM workloads{clause} ORDER BY listed DESC", params, limit=limit)


class MongoWorkloadRepo(MongoCollection[WorkloadRecord]):
    aggregate = NAME
    record_type = WorkloadRecord

    def _workload_document(self, rec: WorkloadRecord) -> Document:
        return self._document(rec.id, rec) | {"listed": workload_order(rec.created_at, rec.id)}

    async def get(self, workload_id: str) -> WorkloadRecord | None:
        return await self._get(workload_id)

    async def insert(self, rec: WorkloadRecord) -> None:
        doc = {"_id": rec.id} | self._workload_document(rec)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)
        except DuplicateKeyError:
            raise DuplicateWorkload(f"workload {rec.id!r} is already stored") from None

    async def update(self, rec: WorkloadRecord, *, expected_version: int) -> None:
        doc = self._workload_document(rec)
        with self._metrics.timed_write(self.aggregate):
            # One atomic document update: of two writers that read the same version, only the first matches.
            result = await self._c.update_one({"_id": rec.id, "version": expected_version}, set_fields(doc))
        if result.matched_count != 1:
            raise StaleWorkload(
                f"workload {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        states: Collection[str] | None = None,
        before: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[WorkloadRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        query = only(account=account)
        if states is not None:
            query["state"] = {"$in": builtins.list(states)}
        if before is not None:
            query["listed"] = {"$lt": before}
        return await self._find(query, [("listed", DESCENDING)], limit)


WORKLOADS: AggregatePlugin[WorkloadRepo] = AggregatePlugin(NAME, SqliteWorkloadRepo, MongoWorkloadRepo)
