"""Agents (hosts) in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from master.records import AgentRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable

_UPSERT = "INSERT OR REPLACE INTO agents (id, provider, state, doc) VALUES (?, ?, ?, ?)"


class SqliteAgentRepo(SqliteTable[AgentRecord]):
    aggregate = Aggregate.AGENTS
    record_type = AgentRecord

    async def get(self, agent_id: str) -> AgentRecord | None:
        return await self._select_one("SELECT id, doc FROM agents WHERE id = ?", (agent_id,))

    async def put(self, rec: AgentRecord) -> None:
        await self._write(_UPSERT, rec.id, self._row(rec))

    async def put_many(self, recs: Sequence[AgentRecord]) -> None:
        await self._write_many(_UPSERT, [(r.id, self._row(r)) for r in recs])

    def _row(self, rec: AgentRecord) -> tuple[str, str, str, str]:
        return (rec.id, rec.provider, rec.state, self._doc(rec.id, rec))

    async def list(self, *, state: str | None = None, provider: str | None = None) -> builtins.list[AgentRecord]:
        clause, params = where(("state = ?", state), ("provider = ?", provider))
        return await self._select(f"SELECT id, doc FROM agents{clause} ORDER BY id", params)
