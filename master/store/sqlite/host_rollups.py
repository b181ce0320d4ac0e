"""A host's own telemetry rollups (one host, one minute; or one host, one hour) in SQLite."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection, Sequence

from master.records import HostRollup
from master.store.aggregates import Aggregate, host_rollup_key
from master.store.sqlite.database import transaction, where
from master.store.sqlite.table import SqliteTable


class SqliteHostRollupRepo(SqliteTable[HostRollup]):
    """The one-minute host rollups; the table is named after ``aggregate`` (SqliteHostHourlyRollupRepo's is another)."""

    aggregate = Aggregate.HOST_ROLLUPS
    record_type = HostRollup

    async def put_many(self, recs: Sequence[HostRollup]) -> None:
        keyed = [(key := host_rollup_key(r.agent_id, r.minute), (r.agent_id, r.minute, self._doc(key, r))) for r in recs]
        table = self.aggregate.value
        await self._write_many(f"INSERT OR REPLACE INTO {table} (agent_id, minute, doc) VALUES (?, ?, ?)", keyed)

    async def list(self, agent_id: str, *, since_minute: int = 0, until_minute: int | None = None) -> builtins.list[HostRollup]:
        clause, params = where(("agent_id = ?", agent_id), ("minute >= ?", since_minute), ("minute < ?", until_minute))
        table = self.aggregate.value
        return await self._select(f"SELECT agent_id || ':' || minute, doc FROM {table}{clause} ORDER BY minute", params)

    async def delete_before(self, agent_ids: Collection[str], before_minute: int) -> int:
        """One DELETE per host, each a range of the primary key, all in one transaction."""
        sql = f"DELETE FROM {self.aggregate.value} WHERE agent_id = ? AND minute < ?"
        ids = list(agent_ids)

        def work(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                return sum(conn.execute(sql, (agent_id, before_minute)).rowcount for agent_id in ids)

        if not ids:
            return 0
        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(work)


class SqliteHostHourlyRollupRepo(SqliteHostRollupRepo):
    aggregate = Aggregate.HOST_HOURLY_ROLLUPS
