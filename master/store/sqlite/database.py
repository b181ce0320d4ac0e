"""The SQLite file and the one worker thread that owns its connection.

One worker thread does all database work, so the Master's event loop never waits on the disk. A second connection,
on a thread of its own, copies the write-ahead log back into the file every ``CHECKPOINT_PERIOD_S`` (a passive
checkpoint, which never blocks a writer): with SQLite's own checkpoints, the commit that crossed 1,000 pages of log
did the copy and its fsyncs itself, and every write queued behind it waited (a commit's p99 16 ms and p99.9 111 ms
against 4 and 18 without, on this machine at load 11; docs/endpoints.md, "The request path's cost").
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

from master.loops import Loop, stop_loop

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another process's write lock before failing
MEMORY = ":memory:"
CHECKPOINT_PERIOD_S = 0.5
# After a checkpoint resets the log, a log file larger than this is cut back to it (a burst's log is not kept forever).
WAL_SIZE_LIMIT_BYTES = 64 << 20


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

    def __init__(self, path: str, *, checkpoint_period_s: float = CHECKPOINT_PERIOD_S) -> None:
        self.path = path
        self.checkpoint_period_s = checkpoint_period_s  # 0: SQLite checkpoints on the writer's commits itself
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._checkpoints: Checkpoints | None = None

    async def open(self) -> None:
        background = self.path != MEMORY and self.checkpoint_period_s > 0
        if self.path != MEMORY:
            _make_private_file(Path(self.path))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idlegrid-sqlite")
        await self._submit(lambda: self._connect(own_checkpoints=not background))
        if background:
            self._checkpoints = Checkpoints(self.path, self.checkpoint_period_s)
            await self._checkpoints.start()

    def _connect(self, *, own_checkpoints: bool) -> None:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE), never opened behind our back.
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
        # Safe with WAL: a power loss may lose the last commits but never corrupts the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        if not own_checkpoints:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpoints' thread copies the log back
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
        self._conn = conn

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._checkpoints is not None:
            await self._checkpoints.stop()
            self._checkpoints = None
        if self._conn is not None:
            await self._submit(self._disconnect)  # the last connection: SQLite checkpoints and removes the log
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


class Checkpoints:
    """Passive checkpoints of one database file every ``period_s``, on a connection and a thread of their own: the log's
    pages copied back into the file, and its fsyncs made, while writers go on appending to the log."""

    def __init__(self, path: str, period_s: float) -> None:
        self.path = path
        self.period_s = period_s
        self.done = 0  # checkpoints made (the tests' count)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idlegrid-sqlite-checkpoint")
        await self._run(self._connect)
        self._loop = Loop("sqlite checkpoints", self.period_s, self.checkpoint, restart_s=self.period_s).start()

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA synchronous = NORMAL")
        self._conn = conn

    async def checkpoint(self) -> None:
        """One passive checkpoint: as much of the log as no reader still needs, without waiting for any lock."""
        await self._run(self._checkpoint)
        self.done += 1

    def _checkpoint(self) -> None:
        assert self._conn is not None
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    async def stop(self) -> None:
        await stop_loop(self._loop)
        self._loop = None
        if self._executor is not None:
            await self._run(self._close)
            self._executor.shutdown(wait=True)
            self._executor = None

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _run(self, work: Callable[[], None]) -> None:
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(self._executor, work)


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
