"""Renters' serverless endpoints and their invocation keys (docs/endpoints.md, "The endpoint resource"), in the
Master's store: one record per endpoint and one per key, by id.

SQLite: ``endpoints (id, account, created_at, doc)``, indexed by ``(account, created_at)``; ``endpoint_keys (id,
endpoint, key_hash, created_at, doc)``, indexed by ``key_hash`` and by ``(endpoint, created_at)``. MongoDB: one
document per record, ``_id`` its id, indexed alike. One step of master/store/migrations.py makes both.
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from management.endpoints.spec import EndpointKeyRecord, EndpointRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only, where

NAME = "endpoints"
KEYS_NAME = "endpoint_keys"


class EndpointRepo(Protocol):
    """Renters' endpoints, keyed by id."""

    async def put(self, rec: EndpointRecord) -> None:
        """Insert, or replace the endpoint of the same id."""

    async def get(self, endpoint_id: str) -> EndpointRecord | None: ...

    async def delete(self, endpoint_id: str) -> bool:
        """Remove one endpoint; False when there was none."""

    async def list(self, *, account: str | None = None) -> builtins.list[EndpointRecord]:
        """Every endpoint (of one account when given), by creation, then id."""


class EndpointKeyRepo(Protocol):
    """Endpoints' invocation keys, keyed by id, found by their hash."""

    async def put(self, rec: EndpointKeyRecord) -> None:
        """Insert, or replace the key of the same id (a revoke)."""

    async def by_hash(self, key_hash: str) -> EndpointKeyRecord | None: ...

    async def list(self, endpoint_id: str) -> builtins.list[EndpointKeyRecord]:
        """One endpoint's keys, revoked ones included, by creation, then id."""

    async def delete_of(self, endpoint_id: str) -> int:
        """Remove every key of one endpoint (it is deleted); how many there were."""


class SqliteEndpointRepo(SqliteTable[EndpointRecord]):
    aggregate = NAME
    record_type = EndpointRecord

    async def put(self, rec: EndpointRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO endpoints (id, account, created_at, doc) VALUES (?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.account, rec.created_at, self._doc(rec.id, rec)),
        )

    async def get(self, endpoint_id: str) -> EndpointRecord | None:
        return await self._select_one("SELECT id, doc FROM endpoints WHERE id = ?", (endpoint_id,))

    async def delete(self, endpoint_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(lambda conn: conn.execute("DELETE FROM endpoints WHERE id = ?", (endpoint_id,)).rowcount)
        self._quarantine.release(self.aggregate, [endpoint_id])
        return bool(removed == 1)

    async def list(self, *, account: str | None = None) -> builtins.list[EndpointRecord]:
        clause, params = where(("account = ?", account))
        return await self._select(f"SELECT id, doc FROM endpoints{clause} ORDER BY created_at, id", params)


class MongoEndpointRepo(MongoCollection[EndpointRecord]):
    aggregate = NAME
    record_type = EndpointRecord

    async def put(self, rec: EndpointRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, endpoint_id: str) -> EndpointRecord | None:
        return await self._get(endpoint_id)

    async def delete(self, endpoint_id: str) -> bool:
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": endpoint_id})
        self._quarantine.release(self.aggregate, [endpoint_id])
        return result.deleted_count == 1

    async def list(self, *, account: str | None = None) -> builtins.list[EndpointRecord]:
        return await self._find(only(account=account), [("created_at", ASCENDING), ("_id", ASCENDING)])


class SqliteEndpointKeyRepo(SqliteTable[EndpointKeyRecord]):
    aggregate = KEYS_NAME
    record_type = EndpointKeyRecord

    async def put(self, rec: EndpointKeyRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO endpoint_keys (id, endpoint, key_hash, created_at, doc) VALUES (?, ?, ?, ?, ?)",
            rec.id,
            (rec.id, rec.endpoint, rec.key_hash, rec.created_at, self._doc(rec.id, rec)),
        )

    async def by_hash(self, key_hash: str) -> EndpointKeyRecord | None:
        return await self._select_one("SELECT id, doc FROM endpoint_keys WHERE key_hash = ?", (key_hash,))

    async def list(self, endpoint_id: str) -> builtins.list[EndpointKeyRecord]:
        return await self._select("SELECT id, doc FROM endpoint_keys WHERE endpoint = ? ORDER BY created_at, id", (endpoint_id,))

    async def delete_of(self, endpoint_id: str) -> int:
        ids = [k.id for k in await self.list(endpoint_id)]
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(
                lambda conn: conn.execute("DELETE FROM endpoint_keys WHERE endpoint = ?", (endpoint_id,)).rowcount
            )
        self._quarantine.release(self.aggregate, ids)
        return int(removed)


class MongoEndpointKeyRepo(MongoCollection[EndpointKeyRecord]):
    aggregate = KEYS_NAME
    record_type = EndpointKeyRecord

    async def put(self, rec: EndpointKeyRecord) -> None:
        await self._upsert(rec.id, rec)

    async def by_hash(self, key_hash: str) -> EndpointKeyRecord | None:
        found = await self._find({"key_hash": key_hash}, [("_id", ASCENDING)], limit=1)
        return found[0] if found else None

    async def list(self, endpoint_id: str) -> builtins.list[EndpointKeyRecord]:
        return await self._find({"endpoint": endpoint_id}, [("created_at", ASCENDING), ("_id", ASCENDING)])

    async def delete_of(self, endpoint_id: str) -> int:
        ids = [k.id for k in await self.list(endpoint_id)]
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_many({"endpoint": endpoint_id})
        self._quarantine.release(self.aggregate, ids)
        return int(result.deleted_count)


ENDPOINTS: AggregatePlugin[EndpointRepo] = AggregatePlugin(NAME, SqliteEndpointRepo, MongoEndpointRepo)
ENDPOINT_KEYS: AggregatePlugin[EndpointKeyRepo] = AggregatePlugin(KEYS_NAME, SqliteEndpointKeyRepo, MongoEndpointKeyRepo)
