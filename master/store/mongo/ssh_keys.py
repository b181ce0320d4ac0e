"""Accounts' SSH public keys in MongoDB (docs/ssh.md): one document per key, ``_id`` its id."""

from __future__ import annotations

import builtins

from pymongo import ASCENDING

from master.records import SshKeyRecord
from master.store.aggregates import Aggregate
from master.store.mongo.collection import MongoCollection, only


class MongoSshKeyRepo(MongoCollection[SshKeyRecord]):
    aggregate = Aggregate.SSH_KEYS
    record_type = SshKeyRecord

    async def put(self, rec: SshKeyRecord) -> None:
        await self._upsert(rec.id, rec)

    async def delete(self, key_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": key_id})
        self._quarantine.release(self.aggregate, [key_id])
        return result.deleted_count == 1

    async def list(self, *, account: str | None = None) -> builtins.list[SshKeyRecord]:
        return await self._find(only(account=account), [("created_at", ASCENDING), ("_id", ASCENDING)])
