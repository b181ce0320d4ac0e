"""API keys in SQLite."""

from __future__ import annotations

from master.records import ApiKeyRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.table import SqliteTable


class SqliteApiKeyRepo(SqliteTable[ApiKeyRecord]):
    aggregate = Aggregate.API_KEYS
    record_type = ApiKeyRecord

    async def put(self, rec: ApiKeyRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO api_keys (key_hash, doc) VALUES (?, ?)",
            rec.key_hash,
            (rec.key_hash, self._doc(rec.key_hash, rec)),
        )

    async def get(self, key_hash: str) -> ApiKeyRecord | None:
        return await self._select_one("SELECT key_hash, doc FROM api_keys WHERE key_hash = ?", (key_hash,))
