"""The scheduler's decayed usage (``FairShareUsage``), in the Master's store: one figure per account and per (account,
project), keyed by ``fair_share_key``, written whole (last writer wins: docs/scheduler.md).

SQLite: ``fair_share (key, account, doc)`` (small: one row per account and project); MongoDB: one document per figure,
``_id`` its key, indexed by account (schema version 5, master/store/migrations.py).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Protocol

from master.port import FairShareUsage
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable

NAME = "fair_share"


def fair_share_key(account: str, project: str | None) -> str:
    """The key of one fair-share figure, in both backends: the account id (which has no "/"), then "/project"."""
    return account if project is None else f"{account}/{project}"


def fair_share_order(rec: FairShareUsage) -> tuple[str, bool, str]:
    """Where a fair-share figure sorts in both backends: by account, its own figure first, then by project."""
    return (rec.account, rec.project is not None, rec.project or "")


class FairShareRepo(Protocol):
    """The scheduler's decayed usage, one figure per account and per (account, project), keyed by
    ``fair_share_key``. Figures are written whole (last writer wins: see docs/scheduler.md)."""

    async def put_many(self, recs: Sequence[FairShareUsage]) -> None:
        """Insert, or replace the figures with the same (account, project), in one batch."""

    async def list(self) -> builtins.list[FairShareUsage]:
        """Every figure, by account, the account's own figure before its projects, then by project."""


class SqliteFairShareRepo(SqliteTable[FairShareUsage]):
    aggregate = NAME
    record_type = FairShareUsage

    async def put_many(self, recs: Sequence[FairShareUsage]) -> None:
        keyed = [(key := fair_share_key(r.account, r.project), (key, r.account, self._doc(key, r))) for r in recs]
        await self._write_many("INSERT OR REPLACE INTO fair_share (key, account, doc) VALUES (?, ?, ?)", keyed)

    async def list(self) -> builtins.list[FairShareUsage]:
        return sorted(await self._select("SELECT key, doc FROM fair_share"), key=fair_share_order)


class MongoFairShareRepo(MongoCollection[FairShareUsage]):
    aggregate = NAME
    record_type = FairShareUsage

    async def put_many(self, recs: Sequence[FairShareUsage]) -> None:
        await self._upsert_many([(fair_share_key(r.account, r.project), r) for r in recs])

    async def list(self) -> builtins.list[FairShareUsage]:
        return sorted(await self._find({}, []), key=fair_share_order)


FAIR_SHARE: AggregatePlugin[FairShareRepo] = AggregatePlugin(NAME, SqliteFairShareRepo, MongoFairShareRepo)
