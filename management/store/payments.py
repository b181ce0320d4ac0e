"""Money coming in (docs/payments.md), in the Master's store: renters' top-ups, and the payment provider's events the
grid acted on, so a delivery seen again (a retry, a replay, after any restart) moves nothing.

SQLite: ``topups (id, account, created_at, doc)``, indexed by ``(account, created_at)``; ``payment_events (id,
received_at, doc)``, ``id`` the provider and its event id, inserted once. MongoDB: one document per record, ``_id`` its
id, a top-up's indexed by ``(account, created_at)``; an event's insert is one ``insert_one`` (``_id`` unique: of
concurrent inserts of one event, one inserts). Schema version 18 (master/store/migrations.py).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import DESCENDING
from pymongo.errors import DuplicateKeyError

from management.payments.records import PaymentEventRecord, TopupRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only

TOPUPS_NAME = "topups"
EVENTS_NAME = "payment_events"


class TopupRepo(Protocol):
    """Renters' top-ups, keyed by id."""

    async def put(self, rec: TopupRecord) -> None:
        """Insert, or replace the top-up of the same id (its state changed)."""

    async def get(self, topup_id: str) -> TopupRecord | None: ...

    async def list(self, *, account: str | None = None, limit: int = 100) -> builtins.list[TopupRecord]:
        """Top-ups (of one account when given), newest first, at most ``limit``."""


class PaymentEventRepo(Protocol):
    """The provider's events the grid acted on, keyed by ``event_key(provider, event id)``; never changed."""

    async def insert(self, rec: PaymentEventRecord) -> bool:
        """Store a new event; False (nothing written) when its id is there already, even by a concurrent insert."""

    async def get(self, key: str) -> PaymentEventRecord | None: ...


class SqliteTopupRepo(SqliteTable[TopupRecord]):
    aggregate = TOPUPS_NAME
    record_type = TopupRecord

    async def put(self, rec: TopupRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO topups (id, account, created_at, doc) VALUES (?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.account, rec.created_at, self._doc(rec.id, rec)),
        )

    async def get(self, topup_id: str) -> TopupRecord | None:
        return await self._select_one("SELECT id, doc FROM topups WHERE id = ?", (topup_id,))

    async def list(self, *, account: str | None = None, limit: int = 100) -> builtins.list[TopupRecord]:
        if limit <= 0:
            return []
        clause, params = ("WHERE account = ? ", (account,)) if account is not None else ("", ())
        return await self._select(f"SELECT id, doc FROM topups {clause}ORDER BY created_at DESC, id DESC", params, limit=limit)


class MongoTopupRepo(MongoCollection[TopupRecord]):
    aggregate = TOPUPS_NAME
    record_type = TopupRecord

    async def put(self, rec: TopupRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, topup_id: str) -> TopupRecord | None:
        return await self._get(topup_id)

    async def list(self, *, account: str | None = None, limit: int = 100) -> builtins.list[TopupRecord]:
        if limit <= 0:
            return []
        return await self._find(only(account=account), [("created_at", DESCENDING), ("_id", DESCENDING)], limit)


class SqlitePaymentEventRepo(SqliteTable[PaymentEventRecord]):
    aggregate = EVENTS_NAME
    record_type = PaymentEventRecord

    async def insert(self, rec: PaymentEventRecord) -> bool:
        doc = self._doc(rec.id, rec)
        with self._metrics.timed_write(self.aggregate):
            # OR IGNORE: an event already there is left as it is, and rowcount says whether this insert happened.
            inserted = await self._db.run(
                lambda conn: (
                    conn.execute(
                        "INSERT OR IGNORE INTO payment_events (id, received_at, doc) VALUES (?, ?, ?)",
                        (rec.id, rec.received_at, doc),
                    ).rowcount
                )
            )
        self._quarantine.release(self.aggregate, [rec.id])
        return bool(inserted == 1)

    async def get(self, key: str) -> PaymentEventRecord | None:
        return await self._select_one("SELECT id, doc FROM payment_events WHERE id = ?", (key,))


class MongoPaymentEventRepo(MongoCollection[PaymentEventRecord]):
    aggregate = EVENTS_NAME
    record_type = PaymentEventRecord

    async def insert(self, rec: PaymentEventRecord) -> bool:
        doc = {"_id": rec.id} | self._document(rec.id, rec)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)
        except DuplicateKeyError:
            return False
        self._quarantine.release(self.aggregate, [rec.id])
        return True

    async def get(self, key: str) -> PaymentEventRecord | None:
        return await self._get(key)


TOPUPS: AggregatePlugin[TopupRepo] = AggregatePlugin(TOPUPS_NAME, SqliteTopupRepo, MongoTopupRepo)
PAYMENT_EVENTS: AggregatePlugin[PaymentEventRepo] = AggregatePlugin(EVENTS_NAME, SqlitePaymentEventRepo, MongoPaymentEventRepo)
