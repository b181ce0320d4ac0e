"""Telemetry rollups (one GPU, one minute; or one GPU, one hour) in SQLite."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection, Sequence

from master.records import TelemetryRollup
from master.store.aggregates import Aggregate, rollup_key
from master.store.sqlite.database import transaction, where
from master.store.sqlite.table import SqliteTable


class SqliteRollupRepo(SqliteTable[TelemetryRollup]):
    """The one-minute rollups; the table is named after ``aggregate`` (SqliteHourlyRollupRepo's is another)."""

    aggregate = Aggregate.ROLLUPS
    record_type = TelemetryRollup

    async def put_many(self, recs: Sequence[TelemetryRollup]) -> None:
        keyed = [(key := rollup_key(r.gpu_uuid, r.minute), (r.gpu_uuid, r.minute, self._doc(key, r))) for r in recs]
        table = self.aggregate.value
        await self._write_many(f"INSERT OR REPLACE INTO {table} (gpu_uuid, minute, doc) VALUES (?, ?, ?)", keyed)

    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]:
        clause, params = where(("gpu_uuid = ?", gpu_uuid), ("minute >= ?", since_minute), ("minute < ?", until_minute))
        table = self.aggregate.value
        return await self._select(f"SELECT gpu_uuid || ':' || minute, doc FROM {table}{clause} ORDER BY minute", params)

    async def delete_before(self, gpu_uuids: Collection[str], before_minute: int) -> int:
        """One DELETE per GPU, each a range of the primary key, all in one transaction."""
        sql = f"DELETE FROM {self.aggregate.value} WHERE gpu_uuid = ? AND minute < ?"
        uuids = list(gpu_uuids)

        def work(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                return sum(conn.execute(sql, (uuid, before_minute)).rowcount for uuid in uuids)

        if not uuids:
            return 0
        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(work)


class SqliteHourlyRollupRepo(SqliteRollupRepo):
    aggregate = Aggregate.HOURLY_ROLLUPS
