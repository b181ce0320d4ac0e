"""Money out (docs/payments.md, "Payouts"), in the Master's store: providers' connected payout accounts, and the payouts
of their matured earnings, one per provider and period.

SQLite: ``payout_accounts (id, doc)``, ``id`` the provider's account; ``payouts (id, account, created_at, state, doc)``,
``id`` the payout key, indexed by ``(account, created_at)`` and by ``state`` (a run first finishes the unfinished).
MongoDB: one document per record, ``_id`` its id, payouts indexed alike. Schema version 20
(master/store/migrations.py). Written by one writer at a time (the payout service's lock).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING, DESCENDING

from management.payments.records import PayoutAccountRecord, PayoutRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only

PAYOUT_ACCOUNTS_NAME = "payout_accounts"
PAYOUTS_NAME = "payouts"


class PayoutAccountRepo(Protocol):
    """Providers' connected payout accounts, keyed by the provider's account id."""

    async def put(self, rec: PayoutAccountRecord) -> None:
        """Insert, or replace the account's record."""

    async def get(self, account: str) -> PayoutAccountRecord | None: ...

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[PayoutAccountRecord]:
        """Records in account order, those after ``after``, at most ``limit``."""


class PayoutRepo(Protocol):
    """Payouts, keyed by payout key."""

    async def put(self, rec: PayoutRecord) -> None:
        """Insert, or replace the payout of the same key (its state changed)."""

    async def get(self, key: str) -> PayoutRecord | None: ...

    async def list(
        self, *, account: str | None = None, unfinished: bool = False, limit: int = 100
    ) -> builtins.list[PayoutRecord]:
        """Payouts (of one account; only those not ``paid`` when ``unfinished``), newest first, at most ``limit``."""


class SqlitePayoutAccountRepo(SqliteTable[PayoutAccountRecord]):
    aggregate = PAYOUT_ACCOUNTS_NAME
    record_type = PayoutAccountRecord

    async def put(self, rec: PayoutAccountRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO payout_accounts (id, doc) VALUES (?, ?)", rec.id, (rec.id, self._doc(rec.id, rec))
        )

    async def get(self, account: str) -> PayoutAccountRecord | None:
        return await self._select_one("SELECT id, doc FROM payout_accounts WHERE id = ?", (account,))

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[PayoutAccountRecord]:
        if limit <= 0:
            return []
        return await self._select("SELECT id, doc FROM payout_accounts WHERE id > ? ORDER BY id", (after or "",), limit=limit)


class MongoPayoutAccountRepo(MongoCollection[PayoutAccountRecord]):
    aggregate = PAYOUT_ACCOUNTS_NAME
    record_type = PayoutAccountRecord

    async def put(self, rec: PayoutAccountRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, account: str) -> PayoutAccountRecord | None:
        return await self._get(account)

    async def list(self, *, after: str | None = None, limit: int = 100) -> builtins.list[PayoutAccountRecord]:
        if limit <= 0:
            return []
        return await self._find({"_id": {"$gt": after or ""}}, [("_id", ASCENDING)], limit)


class SqlitePayoutRepo(SqliteTable[PayoutRecord]):
    aggregate = PAYOUTS_NAME
    record_type = PayoutRecord

    async def put(self, rec: PayoutRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO payouts (id, account, created_at, state, doc) VALUES (?, ?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.account, rec.created_at, rec.state, self._doc(rec.id, rec)),
        )

    async def get(self, key: str) -> PayoutRecord | None:
        return await self._select_one("SELECT id, doc FROM payouts WHERE id = ?", (key,))

    async def list(
        self, *, account: str | None = None, unfinished: bool = False, limit: int = 100
    ) -> builtins.list[PayoutRecord]:
        if limit <= 0:
            return []
        clauses, params = [], []
        if account is not None:
            clauses.append("account = ?")
            params.append(account)
        if unfinished:
            clauses.append("state != 'paid'")
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        return await self._select(
            f"SELECT id, doc FROM payouts {where}ORDER BY created_at DESC, id DESC", tuple(params), limit=limit
        )


class MongoPayoutRepo(MongoCollection[PayoutRecord]):
    aggregate = PAYOUTS_NAME
    record_type = PayoutRecord

    async def put(self, rec: PayoutRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, key: str) -> PayoutRecord | None:
        return await self._get(key)

    async def list(
        self, *, account: str | None = None, unfinished: bool = False, limit: int = 100
    ) -> builtins.list[PayoutRecord]:
        if limit <= 0:
            return []
        query = only(account=account) | ({"state": {"$ne": "paid"}} if unfinished else {})
        return await self._find(query, [("created_at", DESCENDING), ("_id", DESCENDING)], limit)


PAYOUT_ACCOUNTS: AggregatePlugin[PayoutAccountRepo] = AggregatePlugin(
    PAYOUT_ACCOUNTS_NAME, SqlitePayoutAccountRepo, MongoPayoutAccountRepo
)
PAYOUTS: AggregatePlugin[PayoutRepo] = AggregatePlugin(PAYOUTS_NAME, SqlitePayoutRepo, MongoPayoutRepo)
