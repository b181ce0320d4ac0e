"""The agent's command ledger: which command ids ran and what they returned, kept across restarts.

It is what makes execution at most once: a command id is recorded as started *before* the runtime
is touched, and a result is kept until the Master acknowledges it. A command id whose copy was refused (its
signature did not verify) is kept as finished with that refusal: the Master takes the refusal as the command's end,
so no later copy of the id may run here, however intact. Anyone on the path can make refusals (a relay that forges
commands, each id new), so refused ids are bounded: past ``REFUSED_KEPT`` the oldest whose refusal the Master
acknowledged are forgotten (the Master ends a command on its refusal and never sends it again).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.state import private_file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executed (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    ok INTEGER,
    result TEXT,
    error TEXT,
    error_code TEXT,
    acked INTEGER NOT NULL DEFAULT 0
);
"""


REFUSED_PREFIX = "command refused: "  # how a refusal's error begins (agent/executor.py); a run's failure never does
REFUSED_KEPT = 10_000  # refused ids kept: enough to outlast any resend of a real one, bounded against a forger


@dataclass(frozen=True)
class CommandLogEntry:
    id: str
    kind: str
    finished: bool
    ok: bool | None
    result: dict[str, Any]
    error: str | None
    error_code: str | None
    acked: bool


class CommandLog:
    def __init__(self, path: Path) -> None:
        # synchronous=FULL: a "started" mark must be on disk before the runtime acts on the command.
        # 0600 before SQLite opens it: its WAL and shared-memory files take the database file's mode.
        self._db = sqlite3.connect(private_file(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, command_id: str) -> CommandLogEntry | None:
        row = self._db.execute(
            "SELECT id, kind, finished_at, ok, result, error, error_code, acked FROM executed WHERE id = ?", (command_id,)
        ).fetchone()
        return None if row is None else _entry(row)

    def start(self, command_id: str, kind: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO executed (id, kind, started_at) VALUES (?, ?, ?)", (command_id, kind, time.time())
        )

    def refuse(self, command_id: str, kind: str, *, error: str, error_code: str) -> CommandLogEntry:
        """Keep ``command_id`` as refused unless this host already knows it; the entry it has now.

        An id this host started or finished keeps what it has: a copy that does not verify says nothing about it."""
        assert error.startswith(REFUSED_PREFIX), error
        now = time.time()
        inserted = self._db.execute(
            "INSERT OR IGNORE INTO executed (id, kind, started_at, finished_at, ok, result, error, error_code) "
            "VALUES (?, ?, ?, ?, 0, '{}', ?, ?)",
            (command_id, kind, now, now, error, error_code),
        ).rowcount
        if inserted:
            self._forget_old_refusals()
        entry = self.get(command_id)
        assert entry is not None  # inserted, or there already
        return entry

    def _forget_old_refusals(self) -> None:
        refused = "ok = 0 AND started_at = finished_at AND error LIKE ? || '%'"
        (count,) = self._db.execute(f"SELECT COUNT(*) FROM executed WHERE {refused}", (REFUSED_PREFIX,)).fetchone()
        if count > REFUSED_KEPT:
            self._db.execute(
                f"DELETE FROM executed WHERE id IN (SELECT id FROM executed WHERE {refused} AND acked = 1 "
                "ORDER BY finished_at LIMIT ?)",
                (REFUSED_PREFIX, count - REFUSED_KEPT),
            )

    def finish(
        self, command_id: str, kind: str, *, ok: bool, result: dict[str, Any], error: str | None, error_code: str | None
    ) -> None:
        self._db.execute(
            "INSERT INTO executed (id, kind, started_at, finished_at, ok, result, error, error_code) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET finished_at=excluded.finished_at, ok=excluded.ok, result=excluded.result, "
            "error=excluded.error, error_code=excluded.error_code",
            (command_id, kind, time.time(), time.time(), int(ok), json.dumps(result), error, error_code),
        )

    def mark_acked(self, command_id: str) -> None:
        self._db.execute("UPDATE executed SET acked = 1 WHERE id = ?", (command_id,))

    def unacked(self) -> list[CommandLogEntry]:
        rows = self._db.execute(
            "SELECT id, kind, finished_at, ok, result, error, error_code, acked FROM executed "
            "WHERE finished_at IS NOT NULL AND acked = 0 ORDER BY finished_at"
        ).fetchall()
        return [_entry(row) for row in rows]

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM executed").fetchone()[0]


def _entry(row: tuple) -> CommandLogEntry:
    return CommandLogEntry(
        id=row[0],
        kind=row[1],
        finished=row[2] is not None,
        ok=None if row[3] is None else bool(row[3]),
        result=json.loads(row[4]) if row[4] else {},
        error=row[5],
        error_code=row[6],
        acked=bool(row[7]),
    )
