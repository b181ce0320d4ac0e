"""Commands in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Collection

from master.records import CommandRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteCommandRepo(SqliteTable[CommandRecord]):
    aggregate = Aggregate.COMMANDS
    record_type = CommandRecord

    async def put(self, rec: CommandRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO commands (id, agent_id, state, created_at, doc) VALUES (?, ?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.agent_id, rec.state, rec.created_at, self._doc(rec.id, rec)),
        )

    async def get(self, command_id: str) -> CommandRecord | None:
        return await self._select_one("SELECT id, doc FROM commands WHERE id = ?", (command_id,))

    async def list(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> builtins.list[CommandRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clause, params = where(("agent_id = ?", agent_id))
        if states is not None:
            in_states = f"state IN ({', '.join('?' for _ in states)})"
            clause += f" AND {in_states}" if clause else f" WHERE {in_states}"
            params += builtins.list(states)
        return await self._select(f"SELECT id, doc FROM commands{clause} ORDER BY created_at DESC, id DESC", params, limit=limit)
