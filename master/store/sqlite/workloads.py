"""Renters' workloads in SQLite: inserted once, then replaced only over the version the writer read."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection

from master.records import WorkloadRecord
from master.store.aggregates import Aggregate, workload_order
from master.store.errors import DuplicateWorkload, StaleWorkload
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteWorkloadRepo(SqliteTable[WorkloadRecord]):
    aggregate = Aggregate.WORKLOADS
    record_type = WorkloadRecord

    async def get(self, workload_id: str) -> WorkloadRecord | None:
        return await self._select_one("SELECT id, doc FROM workloads WHERE id = ?", (workload_id,))

    async def insert(self, rec: WorkloadRecord) -> None:
        row = (rec.id, rec.account, rec.state, workload_order(rec.created_at, rec.id), rec.version, self._doc(rec.id, rec))
        try:
            await self._write(
                "INSERT INTO workloads (id, account, state, listed, version, doc) VALUES (?, ?, ?, ?, ?, ?)", None, row
            )
        except sqlite3.IntegrityError:
            raise DuplicateWorkload(f"workload {rec.id!r} is already stored") from None

    async def update(self, rec: WorkloadRecord, *, expected_version: int) -> None:
        doc = self._doc(rec.id, rec)
        sql = "UPDATE workloads SET account = ?, state = ?, version = ?, doc = ? WHERE id = ? AND version = ?"
        params = (rec.account, rec.state, rec.version, doc, rec.id, expected_version)
        with self._metrics.timed_write(self.aggregate):
            changed = await self._db.run(lambda conn: conn.execute(sql, params).rowcount)
        if changed != 1:
            raise StaleWorkload(
                f"workload {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        states: Collection[str] | None = None,
        before: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[WorkloadRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clause, params = where(("account = ?", account), ("listed < ?", before))
        if states is not None:
            in_states = f"state IN ({', '.join('?' for _ in states)})"
            clause += f" AND {in_states}" if clause else f" WHERE {in_states}"
            params += builtins.list(states)
        return await self._select(f"SELECT id, doc FROM workloads{clause} ORDER BY listed DESC", params, limit=limit)
