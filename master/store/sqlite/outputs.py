"""Workload containers' kept output in SQLite (the record, bytes included, in ``doc``)."""

from __future__ import annotations

import builtins

from master.records import KeptOutput
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteOutputRepo(SqliteTable[KeptOutput]):
    aggregate = Aggregate.OUTPUTS
    record_type = KeptOutput

    async def put(self, rec: KeptOutput) -> None:
        row = (rec.id, rec.workload_id, rec.state, rec.ended_at, self._doc(rec.id, rec))
        await self._write(
            "INSERT OR REPLACE INTO outputs (id, workload_id, state, ended_at, doc) VALUES (?, ?, ?, ?, ?)", rec.id, row
        )

    async def get(self, key: str) -> KeptOutput | None:
        return await self._select_one("SELECT id, doc FROM outputs WHERE id = ?", (key,))

    async def list(
        self, *, workload_id: str | None = None, state: str | None = None, limit: int = 1000
    ) -> builtins.list[KeptOutput]:
        if limit <= 0:
            return []
        clause, params = where(("workload_id = ?", workload_id), ("state = ?", state))
        return await self._select(f"SELECT id, doc FROM outputs{clause} ORDER BY ended_at, id", params, limit=limit)

    async def delete_before(self, ended_before: float) -> int:
        sql = "DELETE FROM outputs WHERE state != 'pending' AND ended_at < ?"
        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(lambda conn: conn.execute(sql, (ended_before,)).rowcount)
