"""Alerting settings, kept in the Master's store: rules put through the API (by name), silences and webhooks (by id).

SQLite: ``alert_rules (name, doc)``, ``silences (id, created_at, expires_at, doc)`` by creation,
``webhooks (id, owner, created_at, doc)`` by owner and creation; MongoDB: one document per record, ``_id`` the name or
the id (nx-27017 refuses ``_id`` in a compound index: ties on creation sort by ``_id`` without one). Schema version 7
(master/store/migrations.py).
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from master.port import AlertRuleRecord, SilenceRecord, WebhookRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only, where

ALERT_RULES_NAME = "alert_rules"
SILENCES_NAME = "silences"
WEBHOOKS_NAME = "webhooks"


class AlertRuleRepo(Protocol):
    """Alert rules put through the API, one per name."""

    async def put(self, rec: AlertRuleRecord) -> None:
        """Insert, or replace the rule of the same name."""

    async def delete(self, name: str) -> bool:
        """Remove one rule; False when there was none."""

    async def list(self) -> builtins.list[AlertRuleRecord]:
        """Every rule, by name."""


class SilenceRepo(Protocol):
    async def put(self, rec: SilenceRecord) -> None:
        """Insert, or replace the silence of the same id (an expiry brought forward)."""

    async def list(self, *, active_at: float | None = None) -> builtins.list[SilenceRecord]:
        """Every silence (those expiring after ``active_at`` when given), by creation, then id."""


class WebhookRepo(Protocol):
    async def put(self, rec: WebhookRecord) -> None:
        """Insert, or replace the webhook of the same id."""

    async def delete(self, webhook_id: str) -> bool:
        """Remove one webhook; False when there was none."""

    async def list(self, *, owner: str | None = None) -> builtins.list[WebhookRecord]:
        """Every webhook (of one owner when given), by creation, then id."""


class SqliteAlertRuleRepo(SqliteTable[AlertRuleRecord]):
    aggregate = ALERT_RULES_NAME
    record_type = AlertRuleRecord

    async def put(self, rec: AlertRuleRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO alert_rules (name, doc) VALUES (?, ?)", rec.name, (rec.name, self._doc(rec.name, rec))
        )

    async def delete(self, name: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(lambda conn: conn.execute("DELETE FROM alert_rules WHERE name = ?", (name,)).rowcount)
        self._quarantine.release(self.aggregate, [name])
        return bool(removed == 1)

    async def list(self) -> builtins.list[AlertRuleRecord]:
        return await self._select("SELECT name, doc FROM alert_rules ORDER BY name")


class SqliteSilenceRepo(SqliteTable[SilenceRecord]):
    aggregate = SILENCES_NAME
    record_type = SilenceRecord

    async def put(self, rec: SilenceRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO silences (id, created_at, expires_at, doc) VALUES (?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.created_at, rec.expires_at, self._doc(rec.id, rec)),
        )

    async def list(self, *, active_at: float | None = None) -> builtins.list[SilenceRecord]:
        clause, params = where(("expires_at > ?", active_at))
        return await self._select(f"SELECT id, doc FROM silences{clause} ORDER BY created_at, id", params)


class SqliteWebhookRepo(SqliteTable[WebhookRecord]):
    aggregate = WEBHOOKS_NAME
    record_type = WebhookRecord

    async def put(self, rec: WebhookRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO webhooks (id, owner, created_at, doc) VALUES (?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.owner, rec.created_at, self._doc(rec.id, rec)),
        )

    async def delete(self, webhook_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(lambda conn: conn.execute("DELETE FROM webhooks WHERE id = ?", (webhook_id,)).rowcount)
        self._quarantine.release(self.aggregate, [webhook_id])
        return bool(removed == 1)

    async def list(self, *, owner: str | None = None) -> builtins.list[WebhookRecord]:
        clause, params = where(("owner = ?", owner))
        return await self._select(f"SELECT id, doc FROM webhooks{clause} ORDER BY created_at, id", params)


class MongoAlertRuleRepo(MongoCollection[AlertRuleRecord]):
    aggregate = ALERT_RULES_NAME
    record_type = AlertRuleRecord

    async def put(self, rec: AlertRuleRecord) -> None:
        await self._upsert(rec.name, rec)

    async def delete(self, name: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": name})
        self._quarantine.release(self.aggregate, [name])
        return result.deleted_count == 1

    async def list(self) -> builtins.list[AlertRuleRecord]:
        return await self._find({}, [("_id", ASCENDING)])


class MongoSilenceRepo(MongoCollection[SilenceRecord]):
    aggregate = SILENCES_NAME
    record_type = SilenceRecord

    async def put(self, rec: SilenceRecord) -> None:
        await self._upsert(rec.id, rec)

    async def list(self, *, active_at: float | None = None) -> builtins.list[SilenceRecord]:
        query = {} if active_at is None else {"expires_at": {"$gt": active_at}}
        return await self._find(query, [("created_at", ASCENDING), ("_id", ASCENDING)])


class MongoWebhookRepo(MongoCollection[WebhookRecord]):
    aggregate = WEBHOOKS_NAME
    record_type = WebhookRecord

    async def put(self, rec: WebhookRecord) -> None:
        await self._upsert(rec.id, rec)

    async def delete(self, webhook_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": webhook_id})
        self._quarantine.release(self.aggregate, [webhook_id])
        return result.deleted_count == 1

    async def list(self, *, owner: str | None = None) -> builtins.list[WebhookRecord]:
        return await self._find(only(owner=owner), [("created_at", ASCENDING), ("_id", ASCENDING)])


ALERT_RULES: AggregatePlugin[AlertRuleRepo] = AggregatePlugin(ALERT_RULES_NAME, SqliteAlertRuleRepo, MongoAlertRuleRepo)
SILENCES: AggregatePlugin[SilenceRepo] = AggregatePlugin(SILENCES_NAME, SqliteSilenceRepo, MongoSilenceRepo)
WEBHOOKS: AggregatePlugin[WebhookRepo] = AggregatePlugin(WEBHOOKS_NAME, SqliteWebhookRepo, MongoWebhookRepo)
