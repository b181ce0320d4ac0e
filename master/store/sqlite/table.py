"""What every SQLite repository shares: its table, the JSON codec of its record type, and the upkeep of
each read (record by record, the undecodable ones quarantined) and each write (refused if unstorable, timed).

Every table keeps the record as JSON (``doc``) beside indexed copies of the fields queries filter on,
and every query of a repository selects ``(key, doc)``: the key names a record that fails to decode.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from master.store.codec import to_json
from master.store.metrics import StoreMetrics
from master.store.quarantine import Quarantine
from master.store.sqlite.database import SqliteDatabase, read_snapshot

R = TypeVar("R", bound=msgspec.Struct)


def _key_of_row(row: tuple[Any, ...]) -> object:
    return row[0]


class SqliteTable(Generic[R]):
    aggregate: str  # an ``Aggregate``, or a plugged aggregate's name (master/store/plugin.py)
    record_type: type[R]

    def __init__(self, db: SqliteDatabase, quarantine: Quarantine, metrics: StoreMetrics) -> None:
        self._db = db
        self._quarantine = quarantine
        self._metrics = metrics
        self._decoder = msgspec.json.Decoder(self.record_type)

    # --- reading -------------------------------------------------------------------------------

    def _decode_row(self, row: tuple[Any, ...]) -> R:
        """A ``(key, doc)`` row's record."""
        return self._decoder.decode(row[1])

    def _decoded(self, rows: Iterable[tuple[Any, ...]]) -> builtins.list[R]:
        """The records of ``rows``, those that fail to decode quarantined and skipped."""
        return self._quarantine.decode_each(self.aggregate, rows, self._decode_row, _key_of_row)

    def _decode_or_quarantine(self, row: tuple[Any, ...] | None) -> R | None:
        decoded = self._decoded([row] if row is not None else [])
        return decoded[0] if decoded else None

    async def _select(self, sql: str, params: Sequence[Any] = (), *, limit: int | None = None) -> builtins.list[R]:
        """The records a ``SELECT key, doc ...`` finds; with ``limit``, that many good ones if there are.

        Quarantined rows do not count against the limit: a page is topped up past them, within one
        read snapshot, so a caller paging through a table is not told it reached the end early.
        """
        if limit is None:
            return await self._db.run(lambda conn: self._decoded(conn.execute(sql, params)))
        return await self._db.run(lambda conn: self._select_limited(conn, sql, params, limit))

    def _select_limited(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any], limit: int) -> builtins.list[R]:
        found: builtins.list[R] = []
        offset = 0
        with read_snapshot(conn):
            while len(found) < limit:
                wanted = limit - len(found)
                rows = conn.execute(f"{sql} LIMIT ? OFFSET ?", [*params, wanted, offset]).fetchall()
                found += self._decoded(rows)
                offset += len(rows)
                if len(rows) < wanted:
                    break
        return found

    async def _select_one(self, sql: str, params: Sequence[Any]) -> R | None:
        return await self._db.run(lambda conn: self._decode_or_quarantine(conn.execute(sql, params).fetchone()))

    # --- writing -------------------------------------------------------------------------------

    def _doc(self, key: object, rec: R) -> str:
        """The JSON to store for ``rec``; UnstorableRecord if it holds a NaN or an infinity."""
        return to_json(self.aggregate, key, rec)

    async def _write(self, sql: str, key: object | None, row: Sequence[Any]) -> int | None:
        """One row in its own transaction; returns the rowid it inserted, if any. ``key``: the record it replaces
        (None for an insert that replaces nothing, such as an event's)."""
        with self._metrics.timed_write(self.aggregate):
            rowid = await self._db.execute(sql, row)
        if key is not None:
            self._quarantine.release(self.aggregate, [key])
        return rowid

    async def _write_many(self, sql: str, keyed_rows: Sequence[tuple[object | None, Sequence[Any]]]) -> None:
        """``(key, row)`` pairs in one transaction (keys as for ``_write``)."""
        if not keyed_rows:
            return
        with self._metrics.timed_write(self.aggregate):
            await self._db.execute_many(sql, [row for _, row in keyed_rows])
        self._quarantine.release(self.aggregate, [key for key, _ in keyed_rows if key is not None])
