"""Rentals in MongoDB: inserted once, then replaced only over the version the writer read.

Beside the record's fields each document carries what lists filter and sort on (decoding ignores them):
``listed`` (aggregates.rental_order), ``host_agents`` and ``host_providers`` (arrays, indexed multikey: a host's or a
provider's rentals), and ``ends``: ``ended_at``, or OPEN_ENDS while the rental runs. ``ends`` exists because
nx-27017 does not match a null inside ``$or`` (nor implements ``$not``), so "open, or ended since t" is ``ends >= t``.
"""

from __future__ import annotations

import builtins
from typing import Any

from pymongo import ASCENDING
from pymongo.errors import DuplicateKeyError

from master.records import RentalRecord
from master.store.aggregates import Aggregate, rental_order
from master.store.errors import StaleRental
from master.store.mongo.collection import MongoCollection, only, set_fields

OPEN_ENDS = 1e300  # ``ends`` of a rental that has not ended: after every real time


class MongoRentalRepo(MongoCollection[RentalRecord]):
    aggregate = Aggregate.RENTALS
    record_type = RentalRecord

    def _rental_document(self, rec: RentalRecord) -> dict[str, Any]:
        return self._document(rec.id, rec) | {
            "listed": rental_order(rec.started_at, rec.id),
            "host_agents": sorted({h.agent_id for h in rec.hosts}),
            "host_providers": sorted({h.provider for h in rec.hosts}),
            "ends": OPEN_ENDS if rec.ended_at is None else rec.ended_at,
        }

    async def get(self, rental_id: str) -> RentalRecord | None:
        return await self._get(rental_id)

    async def insert(self, rec: RentalRecord) -> bool:
        doc = {"_id": rec.id} | self._rental_document(rec)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)  # _id is unique: of concurrent inserts of one id, one inserts
        except DuplicateKeyError:
            return False
        self._quarantine.release(self.aggregate, [rec.id])
        return True

    async def update(self, rec: RentalRecord, *, expected_version: int) -> None:
        doc = self._rental_document(rec)
        with self._metrics.timed_write(self.aggregate):
            # One atomic document update: of two writers that read the same version, only the first matches.
            result = await self._c.update_one({"_id": rec.id, "version": expected_version}, set_fields(doc))
        if result.matched_count != 1:
            raise StaleRental(
                f"rental {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        workload_id: str | None = None,
        agent_id: str | None = None,
        provider: str | None = None,
        open_only: bool = False,
        ended_since: float | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[RentalRecord]:
        if limit <= 0:
            return []
        query = only(account=account, workload_id=workload_id, host_agents=agent_id, host_providers=provider)
        if open_only:
            query["ends"] = OPEN_ENDS
        elif ended_since is not None:
            query["ends"] = {"$gte": ended_since}
        if after is not None:
            query["listed"] = {"$gt": after}
        return await self._find(query, [("listed", ASCENDING)], limit)
