"""Join tokens in SQLite."""

from __future__ import annotations

import sqlite3

import msgspec

from master.records import TokenRecord
from master.store.aggregates import Aggregate
from master.store.base import TokenOutcome
from master.store.sqlite.database import transaction
from master.store.sqlite.table import SqliteTable


class SqliteTokenRepo(SqliteTable[TokenRecord]):
    aggregate = Aggregate.TOKENS
    record_type = TokenRecord

    async def put(self, rec: TokenRecord) -> None:
        await self._write(
            "INSERT OR REPLACE INTO tokens (token_hash, expires_at, used_at, doc) VALUES (?, ?, ?, ?)",
            rec.token_hash,
            (rec.token_hash, rec.expires_at, rec.used_at, self._doc(rec.token_hash, rec)),
        )

    async def consume(self, token_hash: str, *, agent_id: str, now: float) -> tuple[TokenOutcome, TokenRecord | None]:
        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(lambda conn: self._consume(conn, token_hash, agent_id, now))

    def _consume(
        self, conn: sqlite3.Connection, token_hash: str, agent_id: str, now: float
    ) -> tuple[TokenOutcome, TokenRecord | None]:
        with transaction(conn):  # the write lock: another process's consume waits for this one to end
            row = conn.execute("SELECT token_hash, doc FROM tokens WHERE token_hash = ?", (token_hash,)).fetchone()
            token = self._decode_or_quarantine(row)
            if token is None:  # absent, or unreadable (quarantined): either way no one enrolls with it
                return TokenOutcome.UNKNOWN, None
            if token.used_at is not None:
                return TokenOutcome.USED, token
            if token.expires_at <= now:
                return TokenOutcome.EXPIRED, token
            spent = msgspec.structs.replace(token, used_at=now, used_by=agent_id)
            # The condition repeats the checks, so one-time use holds in the statement itself too.
            cursor = conn.execute(
                "UPDATE tokens SET used_at = ?, doc = ? WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?",
                (now, self._doc(token_hash, spent), token_hash, now),
            )
            if cursor.rowcount != 1:  # not while this transaction holds the lock; the guard is for the statement
                return TokenOutcome.USED, token
            return TokenOutcome.OK, spent
