"""Workload containers' output kept after they are deleted (``KeptOutput``), in the Master's store: one record per
replica and attempt, keyed by ``output_key``.

SQLite: ``outputs (id, workload_id, state, ended_at, doc)`` (the record, bytes included, in ``doc``), indexed by
workload and by ``(state, ended_at)``; MongoDB: one document per record, ``_id`` its key, indexed alike (schema version
11, master/store/migrations.py).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from master.port import KeptOutput
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only, where

NAME = "outputs"


def output_key(workload_id: str, replica: int, attempt: int) -> str:
    """The key of one container's kept output (one replica of one attempt of a workload), in both backends."""
    return f"{workload_id}:r{replica}:a{attempt}"


class OutputRepo(Protocol):
    """Workload containers' kept output (``KeptOutput``), one record per replica and attempt."""

    async def put(self, rec: KeptOutput) -> None:
        """Insert, or replace the record with the same id."""

    async def get(self, key: str) -> KeptOutput | None: ...

    async def list(
        self, *, workload_id: str | None = None, state: str | None = None, limit: int = 1000
    ) -> builtins.list[KeptOutput]:
        """Records matching every filter, oldest ``ended_at`` first (then by id)."""

    async def delete_before(self, ended_before: float) -> int:
        """Delete the records that are no longer pending with ``ended_at < ended_before`` (retention); how many."""


class SqliteOutputRepo(SqliteTable[KeptOutput]):
    aggregate = NAME
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


class MongoOutputRepo(MongoCollection[KeptOutput]):
    aggregate = NAME
    record_type = KeptOutput

    async def put(self, rec: KeptOutput) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, key: str) -> KeptOutput | None:
        return await self._get(key)

    async def list(
        self, *, workload_id: str | None = None, state: str | None = None, limit: int = 1000
    ) -> builtins.list[KeptOutput]:
        if limit <= 0:
            return []
        query = only(workload_id=workload_id, state=state)
        return await self._find(query, [("ended_at", ASCENDING), ("_id", ASCENDING)], limit=limit)

    async def delete_before(self, ended_before: float) -> int:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_many({"state": {"$ne": "pending"}, "ended_at": {"$lt": ended_before}})
        return result.deleted_count


OUTPUTS: AggregatePlugin[OutputRepo] = AggregatePlugin(NAME, SqliteOutputRepo, MongoOutputRepo)
