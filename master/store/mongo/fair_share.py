"""The scheduler's fair-share usage in MongoDB: one document per figure, ``_id`` its ``fair_share_key``."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from master.records import FairShareUsage
from master.store.aggregates import Aggregate, fair_share_key, fair_share_order
from master.store.mongo.collection import MongoCollection


class MongoFairShareRepo(MongoCollection[FairShareUsage]):
    aggregate = Aggregate.FAIR_SHARE
    record_type = FairShareUsage

    async def put_many(self, recs: Sequence[FairShareUsage]) -> None:
        await self._upsert_many([(fair_share_key(r.account, r.project), r) for r in recs])

    async def list(self) -> builtins.list[FairShareUsage]:
        return sorted(await self._find({}, []), key=fair_share_order)
