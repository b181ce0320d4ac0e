"""Rentals (``RentalRecord``: one run of a workload, priced), in the Master's store: inserted once, then replaced only
over the version the writer read (``StaleRental`` otherwise); listed by ``rental_order(started_at, id)``.

SQLite: ``rentals`` (``listed`` the order key) and ``rental_hosts``, one row per host of a rental (its agent id and
provider), so a host's or a provider's rentals are found through an index; both are written in one transaction.
MongoDB: beside the record's fields each document carries what lists filter and sort on (decoding ignores them):
``listed``, ``host_agents`` and ``host_providers`` (arrays, indexed multikey), and ``ends``: ``ended_at``, or
``OPEN_ENDS`` while the rental runs. ``ends`` exists because nx-27017 does not match a null inside ``$or`` (nor
implements ``$not``), so "open, or ended since t" is ``ends >= t``. Schema version 6 (master/store/migrations.py).
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import Any, Protocol

from pymongo import ASCENDING
from pymongo.errors import DuplicateKeyError

from common.errors import Conflict
from master.port import RentalRecord
from master.store.kit import AggregatePlugin, Document, MongoCollection, SqliteTable, only, set_fields, transaction

NAME = "rentals"

_HOSTS = "INSERT INTO rental_hosts (rental_id, agent_id, provider) VALUES (?, ?, ?)"
OPEN_ENDS = 1e300  # ``ends`` of a rental that has not ended: after every real time


def rental_order(started_at: float, rental_id: str) -> str:
    """Where a rental sorts in lists, in both backends: by start, then id, as one comparable string."""
    return f"{started_at:020.6f}|{rental_id}"


class StaleRental(Conflict):
    """A rental write that named a version other than the stored one: someone else wrote it first. Read it again."""


class RentalRepo(Protocol):
    """Rentals (one run of a workload, priced); written with a version check like workloads."""

    async def get(self, rental_id: str) -> RentalRecord | None: ...

    async def insert(self, rec: RentalRecord) -> bool:
        """Store a new rental; False (nothing written) when its id is taken, even by a concurrent insert."""

    async def update(self, rec: RentalRecord, *, expected_version: int) -> None:
        """Replace the stored rental if its stored ``version`` is ``expected_version``, else StaleRental (also when
        it is not stored). The caller sets ``rec.version``."""

    async def list(
        self,
        *,
        account: str | None = None,
        workload_id: str | None = None,
        agent_id: str | None = None,
        provider: str | None = None,
        open_only: bool = False,
        ended_since: float | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[RentalRecord]:
        """Rentals matching every filter, by ``started_at`` then id (ascending); ``agent_id``/``provider``: rentals
        with a host of theirs; ``open_only``: not ended; ``ended_since``: open, or ended at or after it; ``after``: an
        order key (``rental_order``) of the last one of the previous page."""


class SqliteRentalRepo(SqliteTable[RentalRecord]):
    aggregate = NAME
    record_type = RentalRecord

    def _host_rows(self, rec: RentalRecord) -> builtins.list[tuple[str, str, str]]:
        return sorted({(rec.id, h.agent_id, h.provider) for h in rec.hosts})

    async def get(self, rental_id: str) -> RentalRecord | None:
        return await self._select_one("SELECT id, doc FROM rentals WHERE id = ?", (rental_id,))

    async def insert(self, rec: RentalRecord) -> bool:
        row = (
            rec.id,
            rec.workload_id,
            rec.account,
            rental_order(rec.started_at, rec.id),
            rec.ended_at,
            rec.version,
            self._doc(rec.id, rec),
        )
        hosts = self._host_rows(rec)

        def insert(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                # OR IGNORE: a taken id is left as it is, and rowcount says whether this insert happened.
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO rentals (id, workload_id, account, listed, ended_at, version, doc)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                if cursor.rowcount != 1:
                    return False
                conn.executemany(_HOSTS, hosts)
                return True

        with self._metrics.timed_write(self.aggregate):
            inserted = await self._db.run(insert)
        if inserted:
            self._quarantine.release(self.aggregate, [rec.id])
        return inserted

    async def update(self, rec: RentalRecord, *, expected_version: int) -> None:
        params = (
            rec.workload_id,
            rec.account,
            rental_order(rec.started_at, rec.id),
            rec.ended_at,
            rec.version,
            self._doc(rec.id, rec),
            rec.id,
            expected_version,
        )
        hosts = self._host_rows(rec)

        def update(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                cursor = conn.execute(
                    "UPDATE rentals SET workload_id = ?, account = ?, listed = ?, ended_at = ?, version = ?, doc = ?"
                    " WHERE id = ? AND version = ?",
                    params,
                )
                if cursor.rowcount != 1:
                    return False
                conn.execute("DELETE FROM rental_hosts WHERE rental_id = ?", (rec.id,))
                conn.executemany(_HOSTS, hosts)
                return True

        with self._metrics.timed_write(self.aggregate):
            changed = await self._db.run(update)
        if not changed:
            raise StaleRental(
                f"rental {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        workload_id: str | None = None,
        agent_id: str | None = None,
        provider: str | None = None,
        open_only: bool = False,
        ended_since: float | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[RentalRecord]:
        if limit <= 0:
            return []
        conditions: builtins.list[str] = []
        params: builtins.list[Any] = []
        for sql, value in (
            ("account = ?", account),
            ("workload_id = ?", workload_id),
            ("listed > ?", after),
            ("(ended_at IS NULL OR ended_at >= ?)", ended_since),
            ("id IN (SELECT rental_id FROM rental_hosts WHERE agent_id = ?)", agent_id),
            ("id IN (SELECT rental_id FROM rental_hosts WHERE provider = ?)", provider),
        ):
            if value is not None:
                conditions.append(sql)
                params.append(value)
        if open_only:
            conditions.append("ended_at IS NULL")
        clause = " WHERE " + " AND ".join(conditions) if conditions else ""
        return await self._select(f"SELECT id, doc FROM rentals{clause} ORDER BY listed", params, limit=limit)


class MongoRentalRepo(MongoCollection[RentalRecord]):
    aggregate = NAME
    record_type = RentalRecord

    def _rental_document(self, rec: RentalRecord) -> Document:
        return self._document(rec.id, rec) | {
            "listed": rental_order(rec.started_at, rec.id),
            "host_agents": sorted({h.agent_id for h in rec.hosts}),
            "host_providers": sorted({h.provider for h in rec.hosts}),
            "ends": OPEN_ENDS if rec.ended_at is None else rec.ended_at,
        }

    async def get(self, rental_id: str) -> RentalRecord | None:
        return await self._get(rental_id)

    async def insert(self, rec: RentalRecord) -> bool:
        doc = {"_id": rec.id} | self._rental_document(rec)
        try:
            with self._metrics.timed_write(self.aggregate):
                await self._c.insert_one(doc)  # _id is unique: of concurrent inserts of one id, one inserts
        except DuplicateKeyError:
            return False
        self._quarantine.release(self.aggregate, [rec.id])
        return True

    async def update(self, rec: RentalRecord, *, expected_version: int) -> None:
        doc = self._rental_document(rec)
        with self._metrics.timed_write(self.aggregate):
            # One atomic document update: of two writers that read the same version, only the first matches.
            result = await self._c.update_one({"_id": rec.id, "version": expected_version}, set_fields(doc))
        if result.matched_count != 1:
            raise StaleRental(
                f"rental {rec.id!r} is no longer at version {expected_version} (written meanwhile, or never stored)"
            )
        self._quarantine.release(self.aggregate, [rec.id])

    async def list(
        self,
        *,
        account: str | None = None,
        workload_id: str | None = None,
        agent_id: str | None = None,
        provider: str | None = None,
        open_only: bool = False,
        ended_since: float | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[RentalRecord]:
        if limit <= 0:
            return []
        query = only(account=account, workload_id=workload_id, host_agents=agent_id, host_providers=provider)
        if open_only:
            query["ends"] = OPEN_ENDS
        elif ended_since is not None:
            query["ends"] = {"$gte": ended_since}
        if after is not None:
            query["listed"] = {"$gt": after}
        return await self._find(query, [("listed", ASCENDING)], limit)


RENTALS: AggregatePlugin[RentalRepo] = AggregatePlugin(NAME, SqliteRentalRepo, MongoRentalRepo)
