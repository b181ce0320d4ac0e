"""Alerting settings in MongoDB: rules put through the API (``_id`` the name), silences and webhooks (``_id`` the id)."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import AlertRuleRecord, SilenceRecord, WebhookRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoAlertRuleRepo(MongoCollection[AlertRuleRecord]):
    aggregate = Aggregate.ALERT_RULES
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
    aggregate = Aggregate.SILENCES
    record_type = SilenceRecord

    async def put(self, rec: SilenceRecord) -> None:
        await self._upsert(rec.id, rec)

    async def list(self, *, active_at: float | None = None) -> builtins.list[SilenceRecord]:
        query = {} if active_at is None else {"expires_at": {"$gt": active_at}}
        return await self._find(query, [("created_at", ASCENDING), ("_id", ASCENDING)])


class MongoWebhookRepo(MongoCollection[WebhookRecord]):
    aggregate = Aggregate.WEBHOOKS
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
