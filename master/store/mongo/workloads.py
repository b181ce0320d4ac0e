"""Renters' workloads in MongoDB: inserted once, then replaced only over the version the writer read.

Each document carries ``listed`` (aggregates.workload_order) beside the record's fields, the one field lists
sort and page on; decoding ignores it.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Any

from pymongo import DESCENDING
from pymongo.errors import DuplicateKeyError

from master.records import WorkloadRecord
from master.store.aggregates import Aggregate, workload_order
from master.store.errors import DuplicateWorkload, StaleWorkload
from master.store.mongo.collection import MongoCollection, only, set_fields


class MongoWorkloadRepo(MongoCollection[WorkloadRecord]):
    aggregate = Aggregate.WORKLOADS
    record_type = WorkloadRecord

    def _workload_document(self, rec: WorkloadRecord) -> dict[str, Any]:
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
