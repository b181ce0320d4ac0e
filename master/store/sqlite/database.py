"""The SQLite file and the one worker thread that owns its connection.

One worker thread does all database work, so the Master's event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another process's write lock before failing
MEMORY = ":memory:"


def _make_private_file(path: Path) -> None:
    """The store's file exists and is 0600 (its ``-wal`` and ``-shm`` too, when there): SQLite creates a missing one
    under the umask (0644 under 022) and gives ``-wal`` and ``-shm`` the database's mode. A directory made for it is
    0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for sibling in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(sibling, 0o600)


class SqliteDatabase:
    """One connection, used only from its own worker thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        if self.path != MEMORY:
            _make_private_file(Path(self.path))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idlegrid-sqlite")
        await self._submit(self._connect)

    def _connect(self) -> None:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE), never opened behind our back.
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
        # Safe with WAL: a power loss may lose the last commits but never corrupts the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        self._conn = conn

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._conn is not None:
            await self._submit(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    def _disconnect(self) -> None:
        assert self._conn is not None
        self._conn.close()
        self._conn = None

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` with the connection on the worker thread."""
        return await self._submit(lambda: work(self._connection()))

    async def _submit(self, work: Callable[[], T]) -> T:
        if self._executor is None:
            raise RuntimeError(f"the SQLite store at {self.path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the SQLite store at {self.path} is not open")
        return self._conn

    async def execute(self, sql: str, params: Sequence[Any]) -> int | None:
        """One statement in its own transaction; returns the rowid it inserted, if any."""
        return await self.run(lambda conn: conn.execute(sql, params).lastrowid)

    async def execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """One statement over many rows, in one transaction (one commit, not one per row)."""

        def work(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.executemany(sql, rows)

        await self.run(work)


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the write lock at once, so its reads see what it then writes over."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """A read transaction: its several SELECTs see one state of the file, whatever others commit meanwhile."""
    conn.execute("BEGIN DEFERRED")
    try:
        yield
    finally:
        conn.execute("COMMIT")


def where(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """A WHERE clause from the ``(sql, value)`` conditions whose value is not None."""
    chosen = [(sql, value) for sql, value in conditions if value is not None]
    if not chosen:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in chosen), [value for _, value in chosen]
