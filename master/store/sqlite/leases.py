"""The leader lease in SQLite: one row of ``leader_lease``, each change one ``BEGIN IMMEDIATE`` transaction.

An SQLite file serves one Master process, so the lease there guards against a second Master started on the
same file by mistake (it stands by) and gives the Master the same states and fencing as on MongoDB.
"""

from __future__ import annotations

import sqlite3

from master.records import LeaseRecord
from master.store.sqlite.database import SqliteDatabase, transaction

LEASE_NAME = "leader"
_COLUMNS = "holder, url, api_url, epoch, expires_at"


class SqliteLeaseRepo:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def current(self) -> LeaseRecord | None:
        return await self._db.run(_read)

    async def acquire(self, holder: str, url: str, api_url: str, ttl_s: float, now: float) -> LeaseRecord | None:
        def work(conn: sqlite3.Connection) -> LeaseRecord | None:
            with transaction(conn):
                stored = _read(conn)
                if stored is not None and stored.holder != holder and stored.expires_at > now:
                    return None
                if stored is None:
                    epoch = 1
                else:
                    epoch = stored.epoch if stored.holder == holder else stored.epoch + 1
                lease = LeaseRecord(holder=holder, url=url, api_url=api_url, epoch=epoch, expires_at=now + ttl_s)
                conn.execute(
                    f"INSERT OR REPLACE INTO leader_lease (name, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (LEASE_NAME, lease.holder, lease.url, lease.api_url, lease.epoch, lease.expires_at),
                )
                return lease

        return await self._db.run(work)

    async def renew(self, holder: str, epoch: int, ttl_s: float, now: float) -> LeaseRecord | None:
        def work(conn: sqlite3.Connection) -> LeaseRecord | None:
            with transaction(conn):
                changed = conn.execute(
                    "UPDATE leader_lease SET expires_at = ? WHERE name = ? AND holder = ? AND epoch = ?",
                    (now + ttl_s, LEASE_NAME, holder, epoch),
                ).rowcount
                return _read(conn) if changed else None

        return await self._db.run(work)

    async def release(self, holder: str, epoch: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            return bool(
                conn.execute(
                    "UPDATE leader_lease SET expires_at = 0 WHERE name = ? AND holder = ? AND epoch = ?",
                    (LEASE_NAME, holder, epoch),
                ).rowcount
            )

        return await self._db.run(work)


def _read(conn: sqlite3.Connection) -> LeaseRecord | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM leader_lease WHERE name = ?", (LEASE_NAME,)).fetchone()
    if row is None:
        return None
    holder, url, api_url, epoch, expires_at = row
    return LeaseRecord(holder=holder, url=url, api_url=api_url, epoch=int(epoch), expires_at=float(expires_at))
