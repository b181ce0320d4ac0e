"""Renters' secrets in MongoDB, sealed (the value never in clear: master/secrets.py); ``_id`` is their secret_key."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING
from pymongo.errors import DuplicateKeyError

from master.records import SecretRecord
from master.store.aggregates import Aggregate, secret_key
from master.store.errors import DuplicateSecret
from master.store.mongo.collection import MongoCollection


class MongoSecretRepo(MongoCollection[SecretRecord]):
    aggregate = Aggregate.SECRETS
    record_type = SecretRecord

    async def insert(self, rec: SecretRecord) -> None:
        key = secret_key(rec.account, rec.name)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one({"_id": key, **self._document(key, rec)})
        except DuplicateKeyError:
            raise DuplicateSecret(f"secret {rec.name!r} already exists: delete it first to replace it") from None

    async def get(self, account: str, name: str) -> SecretRecord | None:
        return await self._get(secret_key(account, name))

    async def list(self, account: str) -> builtins.list[SecretRecord]:
        return await self._find({"account": account}, [("name", ASCENDING)])

    async def delete(self, account: str, name: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": secret_key(account, name)})
        return result.deleted_count > 0
