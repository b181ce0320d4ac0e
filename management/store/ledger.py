"""The double-entry ledger (``LedgerEntry``, append-only), in the Master's store: an entry's key is unique, so it is
posted once; an entry whose lines do not sum to zero, or that has none, is refused whole (``UnbalancedEntry``).

SQLite: ``ledger`` holds one row per entry (its ``seq`` from SQLite's rowid, never reused; its ``key`` unique; the
entry as JSON), ``ledger_lines`` one row per line (seq, account, amount), indexed by account: a ledger account's
entries are an index range, and balances one aggregate query, neither decoding any entry. An entry and its lines are
written in one transaction. The stored doc keeps the seq it was given (0, ignored): the row's seq is the one read back.

MongoDB: one document per entry, ``_id`` its key, so posting it is one atomic insert (all its lines or none; of
concurrent posts of one key, one inserts) without a transaction (nx-27017's are not isolated). ``seq`` comes from a
counter in ``meta`` (a unique index), as events' do, and with the same caveat: with several writers an entry may become
visible after one with a higher seq. An account's entries are found through a multikey index on ``lines.account``;
balances are one aggregation. Schema version 6 (master/store/migrations.py).
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import Any, Protocol

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from common.errors import IdlegridError
from master.port import LedgerEntry
from master.store.kit import AggregatePlugin, Document, MongoCollection, SqliteTable, transaction

NAME = "ledger"

_SEQ_COUNTER = "ledger_seq"


class UnbalancedEntry(IdlegridError):
    """A ledger entry whose lines do not sum to zero (or that has none): the ledger refuses it whole."""

    code = "unbalanced_entry"


def refuse_unbalanced(entry: LedgerEntry) -> None:
    """UnbalancedEntry unless ``entry`` has lines and they sum to zero (double entry: money moves, never appears);
    both backends check it before writing any of the entry."""
    if not entry.lines:
        raise UnbalancedEntry(f"ledger entry {entry.key!r} has no lines: an entry moves money from one account to another")
    total = sum(line.amount for line in entry.lines)
    if total != 0:
        raise UnbalancedEntry(
            f"ledger entry {entry.key!r} is unbalanced: its lines sum to {total} micro-units, not 0; "
            "every amount taken off one account must be put onto another"
        )


class LedgerRepo(Protocol):
    """The double-entry ledger: entries are appended, never changed; an entry's key is unique."""

    async def post(self, entry: LedgerEntry) -> int | None:
        """Append ``entry`` atomically (all its lines or none) and return its ``seq``; None, and nothing written, when
        an entry with its key is already there (even one written concurrently). UnbalancedEntry when its lines do not
        sum to zero, or it has none."""

    async def get(self, key: str) -> LedgerEntry | None: ...

    async def list(
        self, *, account: str | None = None, rental: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> builtins.list[LedgerEntry]:
        """Entries with ``seq > after_seq``, ascending; ``account``: those with a line on that ledger account;
        ``rental``: those of that rental."""

    async def balances(self) -> dict[str, int]:
        """The sum of every ledger account's lines (accounts with no line are absent)."""


class SqliteLedgerRepo(SqliteTable[LedgerEntry]):
    aggregate = NAME
    record_type = LedgerEntry

    async def post(self, entry: LedgerEntry) -> int | None:
        refuse_unbalanced(entry)
        doc = self._doc(entry.key, entry)
        lines = [(line.account, line.amount) for line in entry.lines]

        def post(conn: sqlite3.Connection) -> int | None:
            with transaction(conn):
                # OR IGNORE: an entry with this key is already there (perhaps posted by another Master): leave it.
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO ledger (key, rental, doc) VALUES (?, ?, ?)", (entry.key, entry.rental, doc)
                )
                if cursor.rowcount != 1:
                    return None
                seq = cursor.lastrowid
                conn.executemany(
                    "INSERT INTO ledger_lines (seq, account, amount) VALUES (?, ?, ?)", [(seq, a, n) for a, n in lines]
                )
                return seq

        with self._metrics.timed_write(self.aggregate):
            return await self._db.run(post)

    async def get(self, key: str) -> LedgerEntry | None:
        return await self._select_one("SELECT key, doc, seq FROM ledger WHERE key = ?", (key,))

    async def list(
        self, *, account: str | None = None, rental: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> builtins.list[LedgerEntry]:
        if limit <= 0:
            return []
        conditions = ["seq > ?"]
        params: builtins.list[Any] = [after_seq]
        if rental is not None:
            conditions.append("rental = ?")
            params.append(rental)
        if account is not None:
            conditions.append("seq IN (SELECT seq FROM ledger_lines WHERE account = ? AND seq > ?)")
            params += [account, after_seq]
        clause = " AND ".join(conditions)
        return await self._select(f"SELECT key, doc, seq FROM ledger WHERE {clause} ORDER BY seq", params, limit=limit)

    async def balances(self) -> dict[str, int]:
        rows = await self._db.run(
            lambda conn: conn.execute("SELECT account, SUM(amount) FROM ledger_lines GROUP BY account").fetchall()
        )
        return {str(account): int(total) for account, total in rows}

    def _decode_row(self, row: tuple[Any, ...]) -> LedgerEntry:
        entry = self._decoder.decode(row[1])
        entry.seq = row[2]
        return entry


class MongoLedgerRepo(MongoCollection[LedgerEntry]):
    aggregate = NAME
    record_type = LedgerEntry

    async def _take_seq(self) -> int:
        counter = await self._conn.db.meta.find_one_and_update(
            {"_id": _SEQ_COUNTER}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert counter is not None
        return int(counter["value"])

    async def post(self, entry: LedgerEntry) -> int | None:
        refuse_unbalanced(entry)
        doc = self._document(entry.key, entry)  # refused before a seq is taken
        with self._metrics.timed_write(self.aggregate):
            if await self._c.find_one({"_id": entry.key}, projection={"_id": 1}) is not None:
                return None  # posted before: spend no seq on it
            seq = await self._take_seq()
            try:
                await self._c.insert_one({**doc, "_id": entry.key, "seq": seq})
            except DuplicateKeyError:
                return None  # posted meanwhile by another writer; its seq is the one in the ledger
        return seq

    async def get(self, key: str) -> LedgerEntry | None:
        return await self._get(key)

    async def list(
        self, *, account: str | None = None, rental: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> builtins.list[LedgerEntry]:
        if limit <= 0:
            return []
        query: Document = {"seq": {"$gt": after_seq}}
        if account is not None:
            query["lines.account"] = account
        if rental is not None:
            query["rental"] = rental
        return await self._find(query, [("seq", ASCENDING)], limit)

    async def balances(self) -> dict[str, int]:
        # $project between $unwind and $group: nx-27017 groups by a nested path of an unwound array as null.
        pipeline: builtins.list[Document] = [
            {"$unwind": "$lines"},
            {"$project": {"account": "$lines.account", "amount": "$lines.amount"}},
            {"$group": {"_id": "$account", "total": {"$sum": "$amount"}}},
        ]
        cursor = await self._c.aggregate(pipeline)
        return {str(doc["_id"]): int(doc["total"]) for doc in await cursor.to_list() if doc["_id"] is not None}


LEDGER: AggregatePlugin[LedgerRepo] = AggregatePlugin(NAME, SqliteLedgerRepo, MongoLedgerRepo)
