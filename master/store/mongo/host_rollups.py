"""A host's own telemetry rollups (one host, one minute; or one host, one hour) in MongoDB."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence

from pymongo import ASCENDING

from master.records import HostRollup
from master.store.aggregates import Aggregate, host_rollup_key
from master.store.mongo.collection import MongoCollection


class MongoHostRollupRepo(MongoCollection[HostRollup]):
    """Keyed by ``_id = "<agent_id>:<minute>"`` (upserts by _id, as the GPU rollups are, for nx-27017's sake); an index
    on (agent_id, minute) serves the range queries. The collection is named after ``aggregate``."""

    aggregate = Aggregate.HOST_ROLLUPS
    record_type = HostRollup

    async def put_many(self, recs: Sequence[HostRollup]) -> None:
        await self._upsert_many([(host_rollup_key(r.agent_id, r.minute), r) for r in recs])

    async def list(self, agent_id: str, *, since_minute: int = 0, until_minute: int | None = None) -> builtins.list[HostRollup]:
        minute: dict[str, int] = {"$gte": since_minute}
        if until_minute is not None:
            minute["$lt"] = until_minute
        return await self._find({"agent_id": agent_id, "minute": minute}, [("minute", ASCENDING)])

    async def delete_before(self, agent_ids: Collection[str], before_minute: int) -> int:
        """One delete per host: each is a range of the (agent_id, minute) index."""
        deleted = 0
        with self._metrics.timed_write(self.aggregate):
            for agent_id in agent_ids:
                result = await self._c.delete_many({"agent_id": agent_id, "minute": {"$lt": before_minute}})
                deleted += result.deleted_count
        return deleted


class MongoHostHourlyRollupRepo(MongoHostRollupRepo):
    aggregate = Aggregate.HOST_HOURLY_ROLLUPS
