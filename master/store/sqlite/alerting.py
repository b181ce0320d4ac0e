"""Alerting settings in SQLite: rules put through the API (by name), silences and webhooks (by id)."""

from __future__ import annotations

import builtins

from master.records import AlertRuleRecord, SilenceRecord, WebhookRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqliteAlertRuleRepo(SqliteTable[AlertRuleRecord]):
    aggregate = Aggregate.ALERT_RULES
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
    aggregate = Aggregate.SILENCES
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
    aggregate = Aggregate.WEBHOOKS
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
