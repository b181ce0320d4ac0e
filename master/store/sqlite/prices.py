"""Providers' prices in SQLite: one row per (provider, agent_id), keyed by ``aggregates.price_key``."""

from __future__ import annotations

import builtins

from master.records import PriceRecord
from master.store.aggregates import Aggregate, price_key
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable


class SqlitePriceRepo(SqliteTable[PriceRecord]):
    aggregate = Aggregate.PRICES
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
