"""Renters' disputes of rentals (docs/disputes.md) in the Master's store, one record per dispute.

SQLite: ``disputes (id, rental_id, account, provider, created_at, doc)``, indexed by ``(account, created_at)``,
``(provider, created_at)`` and ``rental_id``. MongoDB: one document per dispute, ``_id`` its id, indexed alike. Schema
version 21 (master/store/migrations.py). Written by one writer at a time (the dispute service's lock): last writer wins.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Protocol

from pymongo import DESCENDING

from management.payments.disputes import DisputeRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only

DISPUTES_NAME = "disputes"


class DisputeRepo(Protocol):
    """Disputes, keyed by id."""

    async def put(self, rec: DisputeRecord) -> None:
        """Insert, or replace the dispute of the same id (it was answered or resolved)."""

    async def get(self, dispute_id: str) -> DisputeRecord | None: ...

    async def list(
        self,
        *,
        account: str | None = None,
        provider: str | None = None,
        rental_id: str | None = None,
        states: Collection[str] | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[DisputeRecord]:
        """Disputes matching every filter (``states``: one of these states), newest first (by creation, then id), at
        most ``limit``; with ``before`` (created_at, id) only those after it in that order (the next page of a list)."""


class SqliteDisputeRepo(SqliteTable[DisputeRecord]):
    aggregate = DISPUTES_NAME
    record_type = DisputeRecord

    async def put(self, rec: DisputeRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO disputes (id, rental_id, account, provider, created_at, doc) VALUES (?, ?, ?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.rental_id, rec.account, rec.provider, rec.created_at, self._doc(rec.id, rec)),
        )

    async def get(self, dispute_id: str) -> DisputeRecord | None:
        return await self._select_one("SELECT id, doc FROM disputes WHERE id = ?", (dispute_id,))

    async def list(
        self,
        *,
        account: str | None = None,
        provider: str | None = None,
        rental_id: str | None = None,
        states: Collection[str] | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[DisputeRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clauses: builtins.list[str] = []
        params: builtins.list[object] = []
        for column, value in (("account", account), ("provider", provider), ("rental_id", rental_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if states is not None:
            # The state is in the document only (no column of its own): read there, on the rows the other filters
            # and the order's index already narrowed.
            clauses.append(f"json_extract(doc, '$.state') IN ({', '.join('?' * len(states))})")
            params += sorted(states)
        if before is not None:
            clauses.append("(created_at < ? OR (created_at = ? AND id < ?))")
            params += [before[0], before[0], before[1]]
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        return await self._select(
            f"SELECT id, doc FROM disputes {where}ORDER BY created_at DESC, id DESC", tuple(params), limit=limit
        )


class MongoDisputeRepo(MongoCollection[DisputeRecord]):
    aggregate = DISPUTES_NAME
    record_type = DisputeRecord

    async def put(self, rec: DisputeRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, dispute_id: str) -> DisputeRecord | None:
        return await self._get(dispute_id)

    async def list(
        self,
        *,
        account: str | None = None,
        provider: str | None = None,
        rental_id: str | None = None,
        states: Collection[str] | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[DisputeRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        query = only(account=account, provider=provider, rental_id=rental_id)
        if states is not None:
            query["state"] = {"$in": sorted(states)}
        if before is not None:
            query["$or"] = [{"created_at": {"$lt": before[0]}}, {"created_at": before[0], "_id": {"$lt": before[1]}}]
        return await self._find(query, [("created_at", DESCENDING), ("_id", DESCENDING)], limit)


DISPUTES: AggregatePlugin[DisputeRepo] = AggregatePlugin(DISPUTES_NAME, SqliteDisputeRepo, MongoDisputeRepo)
