"""The embedded store: one SQLite file, nothing to install or start.

Every table keeps the record as JSON (``doc``) beside indexed copies of the fields queries filter on.
One worker thread owns the connection and does all database work, so the Master's event loop never
waits on the disk; records are encoded on the caller's side before the hand-off, so a caller may go
on mutating its record while the write is under way.
"""

from __future__ import annotations

import asyncio
import builtins
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from common.errors import ConfigError
from master.records import (
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuRecord,
    RevocationRecord,
    TelemetryRollup,
    TokenRecord,
)
from master.store.base import (
    AgentRepo,
    ApiKeyRepo,
    CommandRepo,
    EventRepo,
    GpuRepo,
    RevocationRepo,
    RollupRepo,
    TokenOutcome,
    TokenRepo,
    prefix_upper_bound,
)
from master.store.migrations import migrate_sqlite, sqlite_schema_version

T = TypeVar("T")
R = TypeVar("R", bound=msgspec.Struct)

BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another process's write lock before failing
MEMORY = ":memory:"

_encoder = msgspec.json.Encoder()


def _encode(rec: msgspec.Struct) -> str:
    return _encoder.encode(rec).decode()


class SqliteDatabase:
    """One connection, used only from its own worker thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        if self.path != MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
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

    async def fetch(self, sql: str, params: Sequence[Any], decode: Callable[[tuple[Any, ...]], T]) -> list[T]:
        return await self.run(lambda conn: [decode(row) for row in conn.execute(sql, params)])

    async def fetch_one(self, sql: str, params: Sequence[Any], decode: Callable[[tuple[Any, ...]], T]) -> T | None:
        rows = await self.fetch(sql, params, decode)
        return rows[0] if rows else None

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


def where(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """A WHERE clause from the ``(sql, value)`` conditions whose value is not None."""
    chosen = [(sql, value) for sql, value in conditions if value is not None]
    if not chosen:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in chosen), [value for _, value in chosen]


class _Table(Generic[R]):
    """What every repository shares: the database and the JSON codec of its record type."""

    def __init__(self, db: SqliteDatabase, record_type: type[R]) -> None:
        self._db = db
        self._decoder = msgspec.json.Decoder(record_type)

    def _decode_doc(self, row: tuple[Any, ...]) -> R:
        return self._decoder.decode(row[0])

    async def _select(self, sql: str, params: Sequence[Any] = ()) -> builtins.list[R]:
        return await self._db.fetch(sql, params, self._decode_doc)

    async def _select_one(self, sql: str, params: Sequence[Any]) -> R | None:
        return await self._db.fetch_one(sql, params, self._decode_doc)


class SqliteAgentRepo(_Table[AgentRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, AgentRecord)

    async def get(self, agent_id: str) -> AgentRecord | None:
        return await self._select_one("SELECT doc FROM agents WHERE id = ?", (agent_id,))

    async def put(self, rec: AgentRecord) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO agents (id, provider, state, doc) VALUES (?, ?, ?, ?)",
            (rec.id, rec.provider, rec.state, _encode(rec)),
        )

    async def put_many(self, recs: Sequence[AgentRecord]) -> None:
        await self._db.execute_many(
            "INSERT OR REPLACE INTO agents (id, provider, state, doc) VALUES (?, ?, ?, ?)",
            [(r.id, r.provider, r.state, _encode(r)) for r in recs],
        )

    async def list(self, *, state: str | None = None, provider: str | None = None) -> builtins.list[AgentRecord]:
        clause, params = where(("state = ?", state), ("provider = ?", provider))
        return await self._select(f"SELECT doc FROM agents{clause} ORDER BY id", params)


class SqliteGpuRepo(_Table[GpuRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, GpuRecord)

    async def put_many(self, recs: Sequence[GpuRecord]) -> None:
        rows = [(r.uuid, r.agent_id, r.index, r.model, r.state, r.tier, _encode(r)) for r in recs]
        await self._db.execute_many(
            "INSERT OR REPLACE INTO gpus (uuid, agent_id, idx, model, state, tier, doc) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    async def get(self, uuid: str) -> GpuRecord | None:
        return await self._select_one("SELECT doc FROM gpus WHERE uuid = ?", (uuid,))

    async def list(
        self,
        *,
        agent_id: str | None = None,
        tier: str | None = None,
        state: str | None = None,
        model: str | None = None,
    ) -> builtins.list[GpuRecord]:
        clause, params = where(("agent_id = ?", agent_id), ("tier = ?", tier), ("state = ?", state), ("model = ?", model))
        return await self._select(f"SELECT doc FROM gpus{clause} ORDER BY agent_id, idx, uuid", params)


class SqliteCommandRepo(_Table[CommandRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, CommandRecord)

    async def put(self, rec: CommandRecord) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO commands (id, agent_id, state, created_at, doc) VALUES (?, ?, ?, ?, ?)",
            (rec.id, rec.agent_id, rec.state, rec.created_at, _encode(rec)),
        )

    async def get(self, command_id: str) -> CommandRecord | None:
        return await self._select_one("SELECT doc FROM commands WHERE id = ?", (command_id,))

    async def list(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> builtins.list[CommandRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        clause, params = where(("agent_id = ?", agent_id))
        if states is not None:
            in_states = f"state IN ({', '.join('?' for _ in states)})"
            clause += f" AND {in_states}" if clause else f" WHERE {in_states}"
            params += builtins.list(states)
        sql = f"SELECT doc FROM commands{clause} ORDER BY created_at DESC, id DESC LIMIT ?"
        return await self._select(sql, [*params, limit])


class SqliteTokenRepo(_Table[TokenRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, TokenRecord)

    async def put(self, rec: TokenRecord) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO tokens (token_hash, expires_at, used_at, doc) VALUES (?, ?, ?, ?)",
            (rec.token_hash, rec.expires_at, rec.used_at, _encode(rec)),
        )

    async def consume(self, token_hash: str, *, agent_id: str, now: float) -> tuple[TokenOutcome, TokenRecord | None]:
        return await self._db.run(lambda conn: self._consume(conn, token_hash, agent_id, now))

    def _consume(
        self, conn: sqlite3.Connection, token_hash: str, agent_id: str, now: float
    ) -> tuple[TokenOutcome, TokenRecord | None]:
        with transaction(conn):  # the write lock: another process's consume waits for this one to end
            row = conn.execute("SELECT doc FROM tokens WHERE token_hash = ?", (token_hash,)).fetchone()
            if row is None:
                return TokenOutcome.UNKNOWN, None
            token = self._decode_doc(row)
            if token.used_at is not None:
                return TokenOutcome.USED, token
            if token.expires_at <= now:
                return TokenOutcome.EXPIRED, token
            spent = msgspec.structs.replace(token, used_at=now, used_by=agent_id)
            # The condition repeats the checks, so one-time use holds in the statement itself too.
            cursor = conn.execute(
                "UPDATE tokens SET used_at = ?, doc = ? WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?",
                (now, _encode(spent), token_hash, now),
            )
            if cursor.rowcount != 1:  # not while this transaction holds the lock; the guard is for the statement
                return TokenOutcome.USED, token
            return TokenOutcome.OK, spent


class SqliteApiKeyRepo(_Table[ApiKeyRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, ApiKeyRecord)

    async def put(self, rec: ApiKeyRecord) -> None:
        await self._db.execute("INSERT OR REPLACE INTO api_keys (key_hash, doc) VALUES (?, ?)", (rec.key_hash, _encode(rec)))

    async def get(self, key_hash: str) -> ApiKeyRecord | None:
        return await self._select_one("SELECT doc FROM api_keys WHERE key_hash = ?", (key_hash,))


class SqliteEventRepo(_Table[EventRecord]):
    """Events get their seq from SQLite's rowid; the stored doc keeps the seq it was given (ignored)."""

    _INSERT = "INSERT INTO events (ts, kind, subject, doc) VALUES (?, ?, ?, ?)"

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, EventRecord)

    async def append(self, rec: EventRecord) -> int:
        seq = await self._db.execute(self._INSERT, (rec.ts, rec.kind, rec.subject, _encode(rec)))
        assert seq is not None
        return seq

    async def append_many(self, recs: Sequence[EventRecord]) -> None:
        await self._db.execute_many(self._INSERT, [(r.ts, r.kind, r.subject, _encode(r)) for r in recs])

    async def list(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[EventRecord]:
        if limit <= 0:
            return []
        kind_from = kind_prefix or None  # "" is every kind
        kind_to = prefix_upper_bound(kind_prefix) if kind_prefix else None
        clause, params = where(("seq > ?", after_seq), ("subject = ?", subject), ("kind >= ?", kind_from), ("kind < ?", kind_to))
        sql = f"SELECT seq, doc FROM events{clause} ORDER BY seq LIMIT ?"
        return await self._db.fetch(sql, [*params, limit], self._decode_event)

    def _decode_event(self, row: tuple[Any, ...]) -> EventRecord:
        event = self._decoder.decode(row[1])
        event.seq = row[0]
        return event


class SqliteRevocationRepo(_Table[RevocationRecord]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, RevocationRecord)

    async def put(self, rec: RevocationRecord) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO revocations (serial, agent_id, revoked_at, doc) VALUES (?, ?, ?, ?)",
            (rec.serial, rec.agent_id, rec.revoked_at, _encode(rec)),
        )

    async def list(self) -> builtins.list[RevocationRecord]:
        return await self._select("SELECT doc FROM revocations ORDER BY revoked_at, serial")


class SqliteRollupRepo(_Table[TelemetryRollup]):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db, TelemetryRollup)

    async def put_many(self, recs: Sequence[TelemetryRollup]) -> None:
        await self._db.execute_many(
            "INSERT OR REPLACE INTO rollups (gpu_uuid, minute, doc) VALUES (?, ?, ?)",
            [(r.gpu_uuid, r.minute, _encode(r)) for r in recs],
        )

    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]:
        clause, params = where(("gpu_uuid = ?", gpu_uuid), ("minute >= ?", since_minute), ("minute < ?", until_minute))
        return await self._select(f"SELECT doc FROM rollups{clause} ORDER BY minute", params)


class SqliteStore:
    backend = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = SqliteDatabase(path)
        self.agents: AgentRepo = SqliteAgentRepo(self._db)
        self.gpus: GpuRepo = SqliteGpuRepo(self._db)
        self.commands: CommandRepo = SqliteCommandRepo(self._db)
        self.tokens: TokenRepo = SqliteTokenRepo(self._db)
        self.api_keys: ApiKeyRepo = SqliteApiKeyRepo(self._db)
        self.events: EventRepo = SqliteEventRepo(self._db)
        self.revocations: RevocationRepo = SqliteRevocationRepo(self._db)
        self.rollups: RollupRepo = SqliteRollupRepo(self._db)

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    async def open(self) -> None:
        try:
            await self._db.open()
            await self._db.run(lambda conn: migrate_sqlite(conn, store_name=f"the SQLite store at {self.path}"))
        except (sqlite3.Error, OSError) as exc:  # e.g. "file is not a database", or a folder we may not write
            await self._db.close()
            raise ConfigError(f"cannot open the SQLite store at {self.path}: {exc}") from exc
        except BaseException:
            await self._db.close()
            raise

    async def close(self) -> None:
        await self._db.close()

    async def schema_version(self) -> int:
        return await self._db.run(sqlite_schema_version)
