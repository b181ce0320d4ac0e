"""The SQLite store's write-ahead log is copied back into the file by checkpoints of its own (master/store/sqlite/
database.py ``Checkpoints``), never by a writer's commit: the writer's connection has SQLite's automatic checkpoints
off, and what was committed reaches the database file at the next checkpoint."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from master.store.sqlite.database import SqliteDatabase, transaction

FAR = 3600.0  # the loop's period: the test makes each checkpoint itself


def rows_in_the_file_alone(path: Path, tmp_path: Path) -> int:
    """The rows the database file holds without its log (a copy of the file alone)."""
    alone = tmp_path / "alone.db"
    shutil.copyfile(path, alone)
    conn = sqlite3.connect(alone)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM t").fetchone()[0])
    finally:
        conn.close()


async def test_writes_reach_the_file_at_the_store_s_own_checkpoint_not_at_a_commit(tmp_path: Path) -> None:
    path = tmp_path / "master.db"
    db = SqliteDatabase(str(path), checkpoint_period_s=FAR)
    await db.open()
    try:
        assert await db.run(lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
        await db.execute("CREATE TABLE t (n INTEGER, pad TEXT)", ())
        await db.run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())  # the table in the file

        def write(conn: sqlite3.Connection) -> None:
            for n in range(1_500):  # past the 1,000 pages of log at which a commit would have checkpointed itself
                with transaction(conn):
                    conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 3_000))

        await db.run(write)
        assert rows_in_the_file_alone(path, tmp_path) == 0  # every row still only in the log
        checkpoints = db._checkpoints
        assert checkpoints is not None
        await checkpoints.checkpoint()
        assert rows_in_the_file_alone(path, tmp_path) == 1_500
    finally:
        await db.close()
    assert not (tmp_path / "master.db-wal").exists()  # the last connection closed: the log copied back and removed


async def test_with_no_period_sqlite_checkpoints_on_the_writer_s_commits_as_before(tmp_path: Path) -> None:
    db = SqliteDatabase(str(tmp_path / "master.db"), checkpoint_period_s=0)
    await db.open()
    try:
        assert await db.run(lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 1000
        assert db._checkpoints is None
    finally:
        await db.close()
