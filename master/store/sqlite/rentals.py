"""Rentals in SQLite: inserted once, then replaced only over the version the writer read.

Beside the ``rentals`` row, ``rental_hosts`` holds one row per host of a rental (its agent id and provider), so a
host's or a provider's rentals are found through an index; both are written in one transaction.
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import Any

from master.records import RentalRecord
from master.store.aggregates import Aggregate, rental_order
from master.store.errors import StaleRental
from master.store.sqlite.database import transaction
from master.store.sqlite.table import SqliteTable

_HOSTS = "INSERT INTO rental_hosts (rental_id, agent_id, provider) VALUES (?, ?, ?)"


class SqliteRentalRepo(SqliteTable[RentalRecord]):
    aggregate = Aggregate.RENTALS
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
