"""Renters' billing settings (docs/payments.md) in the Master's store: each renter's saved payment method on the
provider, its auto top-up and its spend caps, one record per account.

SQLite: ``billing (id, doc)``, ``id`` the account. MongoDB: one document per account, ``_id`` the account. Schema
version 19 (master/store/migrations.py). Written by one writer at a time (the billing service's lock): last writer wins.
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from management.payments.records import BillingRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable

BILLING_NAME = "billing"


class BillingRepo(Protocol):
    """Renters' billing settings, keyed by account id."""

    async def put(self, rec: BillingRecord) -> None:
        """Insert, or replace the account's record."""

    async def get(self, account: str) -> BillingRecord | None: ...

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[BillingRecord]:
        """Records in account order, those after ``after``, at most ``limit``."""


class SqliteBillingRepo(SqliteTable[BillingRecord]):
    aggregate = BILLING_NAME
    record_type = BillingRecord

    async def put(self, rec: BillingRecord) -> None:
        await self._write("INSERT OR REPLACE INTO billing (id, doc) VALUES (?, ?)", rec.id, (rec.id, self._doc(rec.id, rec)))

    async def get(self, account: str) -> BillingRecord | None:
        return await self._select_one("SELECT id, doc FROM billing WHERE id = ?", (account,))

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[BillingRecord]:
        if limit <= 0:
            return []
        return await self._select("SELECT id, doc FROM billing WHERE id > ? ORDER BY id", (after or "",), limit=limit)


class MongoBillingRepo(MongoCollection[BillingRecord]):
    aggregate = BILLING_NAME
    record_type = BillingRecord

    async def put(self, rec: BillingRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, account: str) -> BillingRecord | None:
        return await self._get(account)

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[BillingRecord]:
        if limit <= 0:
            return []
        return await self._find({"_id": {"$gt": after or ""}}, [("_id", ASCENDING)], limit)


BILLING: AggregatePlugin[BillingRepo] = AggregatePlugin(BILLING_NAME, SqliteBillingRepo, MongoBillingRepo)
