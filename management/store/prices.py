"""Providers' prices (``PriceRecord``), in the Master's store: one record per (provider, host), keyed by ``price_key``;
agent_id "" is the provider's default.

SQLite: ``prices (key, provider, agent_id, doc)``, indexed by ``(provider, agent_id)``; MongoDB: one document per
record, ``_id`` its key, indexed alike (schema version 6, master/store/migrations.py). Both compare strings by code
point, so lists come by provider, then host, the default first.
"""

from __future__ import annotations

import builtins
from typing import Protocol

from pymongo import ASCENDING

from master.port import PriceRecord
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable, only, where

NAME = "prices"


def price_key(provider: str, agent_id: str) -> str:
    """The key of one price record in both backends: the provider, then "/" and the host ("" for its default)."""
    return f"{provider}/{agent_id}"


class PriceRepo(Protocol):
    """Providers' prices, one record per (provider, agent_id); agent_id "" is the provider's default."""

    async def put(self, rec: PriceRecord) -> None:
        """Insert, or replace the record with the same (provider, agent_id)."""

    async def delete(self, provider: str, agent_id: str) -> bool:
        """Remove one record; False when there was none."""

    async def list(self, *, provider: str | None = None) -> builtins.list[PriceRecord]:
        """Every record (of one provider when given), by provider, then agent_id ("" first)."""


class SqlitePriceRepo(SqliteTable[PriceRecord]):
    aggregate = NAME
    record_type = PriceRecord

    async def put(self, rec: PriceRecord) -> None:
        key = price_key(rec.provider, rec.agent_id)
        await self._write(
            "INSERT OR REPLACE INTO prices (key, provider, agent_id, doc) VALUES (?, ?, ?, ?)",
            key,
            (key, rec.provider, rec.agent_id, self._doc(key, rec)),
        )

    async def delete(self, provider: str, agent_id: str) -> bool:
        key = price_key(provider, agent_id)
        with self._metrics.timed_write(self.aggregate):
            removed = await self._db.run(lambda conn: conn.execute("DELETE FROM prices WHERE key = ?", (key,)).rowcount)
        self._quarantine.release(self.aggregate, [key])
        return bool(removed == 1)

    async def list(self, *, provider: str | None = None) -> builtins.list[PriceRecord]:
        clause, params = where(("provider = ?", provider))
        return await self._select(f"SELECT key, doc FROM prices{clause} ORDER BY provider, agent_id", params)


class MongoPriceRepo(MongoCollection[PriceRecord]):
    aggregate = NAME
    record_type = PriceRecord

    async def put(self, rec: PriceRecord) -> None:
        await self._upsert(price_key(rec.provider, rec.agent_id), rec)

    async def delete(self, provider: str, agent_id: str) -> bool:
        key = price_key(provider, agent_id)
        with self._metrics.timed_write(self.aggregate):
            result = await self._c.delete_one({"_id": key})
        self._quarantine.release(self.aggregate, [key])
        return result.deleted_count == 1

    async def list(self, *, provider: str | None = None) -> builtins.list[PriceRecord]:
        return await self._find(only(provider=provider), [("provider", ASCENDING), ("agent_id", ASCENDING)])


PRICES: AggregatePlugin[PriceRepo] = AggregatePlugin(NAME, SqlitePriceRepo, MongoPriceRepo)
