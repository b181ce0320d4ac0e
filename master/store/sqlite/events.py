"""Events in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from master.records import EventRecord
from master.store.aggregates import Aggregate
from master.store.base import prefix_upper_bound
from master.store.sqlite.database import where
from master.store.sqlite.table import SqliteTable

_INSERT = "INSERT INTO events (ts, kind, subject, doc) VALUES (?, ?, ?, ?)"


class SqliteEventRepo(SqliteTable[EventRecord]):
    """Events get their seq from SQLite's rowid; the stored doc keeps the seq it was given (ignored)."""

    aggregate = Aggregate.EVENTS
    record_type = EventRecord

    def _row(self, rec: EventRecord) -> tuple[float, str, str, str]:
        return (rec.ts, rec.kind, rec.subject, self._doc(f"{rec.kind} of {rec.subject}", rec))

    async def append(self, rec: EventRecord) -> int:
        seq = await self._write(_INSERT, None, self._row(rec))
        assert seq is not None
        return seq

    async def append_many(self, recs: Sequence[EventRecord]) -> None:
        await self._write_many(_INSERT, [(None, self._row(r)) for r in recs])

    async def list(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[EventRecord]:
        if limit <= 0:
            return []
        kind_from = kind_prefix or None  # "" is every kind
        kind_to = prefix_upper_bound(kind_prefix) if kind_prefix else None
        clause, params = where(("seq > ?", after_seq), ("subject = ?", subject), ("kind >= ?", kind_from), ("kind < ?", kind_to))
        return await self._select(f"SELECT seq, doc FROM events{clause} ORDER BY seq", params, limit=limit)

    def _decode_row(self, row: tuple[Any, ...]) -> EventRecord:
        event = self._decoder.decode(row[1])
        event.seq = row[0]
        return event
