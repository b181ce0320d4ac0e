"""Commands in MongoDB."""

from __future__ import annotations

import builtins
from collections.abc import Collection

from pymongo import DESCENDING

from master.records import CommandRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoCommandRepo(MongoCollection[CommandRecord]):
    aggregate = Aggregate.COMMANDS
    record_type = CommandRecord
    epoch_guarded = True

    async def put(self, rec: CommandRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, command_id: str) -> CommandRecord | None:
        return await self._get(command_id)

    async def list(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> builtins.list[CommandRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        query = only(agent_id=agent_id)
        if states is not None:
            query["state"] = {"$in": builtins.list(states)}
        return await self._find(query, [("created_at", DESCENDING), ("_id", DESCENDING)], limit)
