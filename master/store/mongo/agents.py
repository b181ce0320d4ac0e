"""Agents (hosts) in MongoDB."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from pymongo import ASCENDING

from master.records import AgentRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoAgentRepo(MongoCollection[AgentRecord]):
    aggregate = Aggregate.AGENTS
    record_type = AgentRecord
    epoch_guarded = True

    async def get(self, agent_id: str) -> AgentRecord | None:
        return await self._get(agent_id)

    async def put(self, rec: AgentRecord) -> None:
        await self._upsert(rec.id, rec)

    async def put_many(self, recs: Sequence[AgentRecord]) -> None:
        await self._upsert_many([(r.id, r) for r in recs])

    async def list(self, *, state: str | None = None, provider: str | None = None) -> builtins.list[AgentRecord]:
        return await self._find(only(state=state, provider=provider), [("_id", ASCENDING)])
