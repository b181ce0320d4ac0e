"""API keys in SQLite."""

from __future__ import annotations

import builtins

from master.records import ApiKeyRecord
from master.store.aggregates import Aggregate
from master.store.sqlite.table import SqliteTable


class SqliteApiKeyRepo(SqliteTable[ApiKeyRecord]):
    aggregate = Aggregate.API_KEYS
    record_type = ApiKeyRecord

    async def put(self, rec: ApiKeyRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO api_keys (key_hash, key_id, subject, created_at, doc) VALUES (?, ?, ?, ?, ?)",
            rec.key_hash,
            (rec.key_hash, rec.key_id or None, rec.subject, rec.created_at, self._doc(rec.key_hash, rec)),
        )

    async def get(self, key_hash: str) -> ApiKeyRecord | None:
        return await self._select_one("SELECT key_hash, doc FROM api_keys WHERE key_hash = ?", (key_hash,))

    async def mark_used(self, key_hash: str, when: float) -> None:
        # One statement on the stored document: whatever else was written to the key since it was read is kept.
        await self._write(
            "UPDATE api_keys SET doc = json_set(doc, '$.last_used', ?) WHERE key_hash = ?", key_hash, (when, key_hash)
        )

    async def by_key_id(self, key_id: str) -> ApiKeyRecord | None:
        if not key_id:
            return None
        return await self._select_one("SELECT key_hash, doc FROM api_keys WHERE key_id = ?", (key_id,))

    async def list(self, *, subject: str) -> builtins.list[ApiKeyRecord]:
        return await self._select("SELECT key_hash, doc FROM api_keys WHERE subject = ? ORDER BY created_at, key_id", (subject,))
