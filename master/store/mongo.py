"""The MongoDB store: one collection per aggregate, one document per record, for Masters sharing a replica set.

Documents are the records as builtins (``msgspec.to_builtins``) keyed by ``_id``, so an operator can
query them directly. Some choices are owed to nx-27017, the wire-compatible server the tests run on
(0.8.1; each is checked by the contract tests, and each is also correct on a real mongod):

- Upserts use ``update_one(..., {"$set": doc}, upsert=True)``: ``replace_one(..., upsert=True)``
  inserts a document with a fresh ObjectId there instead of the filter's ``_id``.
- ``$set`` into an existing document stores a top-level boolean as 0/1 there, so documents are read
  back with ``strict=False``, which turns 0/1 back into booleans (every other field keeps its type).
- Matching ``None`` is reliable there only next to an ``_id`` equality (``{"n": None}`` alone misses
  explicit nulls), which is the one place this module needs it: consuming a token.
- A compound index may not contain ``_id`` there, so events carry their own unique ``seq``.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import msgspec
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

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
from master.store.migrations import migrate_mongo, mongo_schema_version

R = TypeVar("R", bound=msgspec.Struct)

Sort = list[tuple[str, int]]


def _document(rec: msgspec.Struct) -> dict[str, Any]:
    doc = msgspec.to_builtins(rec)
    assert isinstance(doc, dict)
    return doc


def _set(doc: dict[str, Any]) -> dict[str, Any]:
    return {"$set": doc}


class _Connection:
    """The client, made in ``open()`` rather than at construction: it belongs to the event loop that opens it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = database_name(url)
        self._db: AsyncDatabase[dict[str, Any]] | None = None

    @property
    def db(self) -> AsyncDatabase[dict[str, Any]]:
        if self._db is None:
            raise RuntimeError(f"the MongoDB store at {redacted(self.url)} is not open")
        return self._db

    def connect(self) -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(self.url)
        self._db = client[self.database]

    async def disconnect(self) -> None:
        if self._db is not None:
            await self._db.client.close()
            self._db = None


class _Collection(Generic[R]):
    """What every repository shares: its collection and the conversion of its record type."""

    def __init__(self, conn: _Connection, name: str, record_type: type[R]) -> None:
        self._conn = conn
        self._name = name
        self._type = record_type

    @property
    def _c(self) -> AsyncCollection[dict[str, Any]]:
        return self._conn.db[self._name]

    def _decode(self, doc: dict[str, Any]) -> R:
        return msgspec.convert(doc, self._type, strict=False)  # unknown keys such as _id are ignored

    async def _get(self, key: Any) -> R | None:
        doc = await self._c.find_one({"_id": key})
        return None if doc is None else self._decode(doc)

    async def _find(self, query: dict[str, Any], sort: Sort, limit: int = 0) -> builtins.list[R]:
        cursor = self._c.find(query, sort=sort, limit=limit)
        return [self._decode(doc) async for doc in cursor]

    async def _upsert(self, key: Any, rec: msgspec.Struct) -> None:
        await self._c.update_one({"_id": key}, _set(_document(rec)), upsert=True)

    async def _upsert_many(self, keyed: Sequence[tuple[Any, msgspec.Struct]]) -> None:
        """Upsert ``(key, record)`` pairs in one round trip."""
        if keyed:
            ops = [UpdateOne({"_id": key}, _set(_document(rec)), upsert=True) for key, rec in keyed]
            await self._c.bulk_write(ops, ordered=False)


def _only(**filters: Any) -> dict[str, Any]:
    """A query from the equality filters that are not None."""
    return {field: value for field, value in filters.items() if value is not None}


class MongoAgentRepo(_Collection[AgentRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "agents", AgentRecord)

    async def get(self, agent_id: str) -> AgentRecord | None:
        return await self._get(agent_id)

    async def put(self, rec: AgentRecord) -> None:
        await self._upsert(rec.id, rec)

    async def put_many(self, recs: Sequence[AgentRecord]) -> None:
        await self._upsert_many([(r.id, r) for r in recs])

    async def list(self, *, state: str | None = None, provider: str | None = None) -> builtins.list[AgentRecord]:
        return await self._find(_only(state=state, provider=provider), [("_id", ASCENDING)])


class MongoGpuRepo(_Collection[GpuRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "gpus", GpuRecord)

    async def put_many(self, recs: Sequence[GpuRecord]) -> None:
        await self._upsert_many([(r.uuid, r) for r in recs])

    async def get(self, uuid: str) -> GpuRecord | None:
        return await self._get(uuid)

    async def list(
        self,
        *,
        agent_id: str | None = None,
        tier: str | None = None,
        state: str | None = None,
        model: str | None = None,
    ) -> builtins.list[GpuRecord]:
        query = _only(agent_id=agent_id, tier=tier, state=state, model=model)
        return await self._find(query, [("agent_id", ASCENDING), ("index", ASCENDING), ("_id", ASCENDING)])


class MongoCommandRepo(_Collection[CommandRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "commands", CommandRecord)

    async def put(self, rec: CommandRecord) -> None:
        await self._upsert(rec.id, rec)

    async def get(self, command_id: str) -> CommandRecord | None:
        return await self._get(command_id)

    async def list(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> builtins.list[CommandRecord]:
        if limit <= 0 or (states is not None and not states):
            return []
        query = _only(agent_id=agent_id)
        if states is not None:
            query["state"] = {"$in": builtins.list(states)}
        return await self._find(query, [("created_at", DESCENDING), ("_id", DESCENDING)], limit)


class MongoTokenRepo(_Collection[TokenRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "tokens", TokenRecord)

    async def put(self, rec: TokenRecord) -> None:
        await self._upsert(rec.token_hash, rec)

    async def consume(self, token_hash: str, *, agent_id: str, now: float) -> tuple[TokenOutcome, TokenRecord | None]:
        # One atomic document update: of concurrent consumers only one matches "used_at": None.
        spent = await self._c.find_one_and_update(
            {"_id": token_hash, "used_at": None, "expires_at": {"$gt": now}},
            _set({"used_at": now, "used_by": agent_id}),
            return_document=ReturnDocument.AFTER,
        )
        if spent is not None:
            return TokenOutcome.OK, self._decode(spent)
        token = await self._get(token_hash)
        if token is None:
            return TokenOutcome.UNKNOWN, None
        return (TokenOutcome.USED if token.used_at is not None else TokenOutcome.EXPIRED), token


class MongoApiKeyRepo(_Collection[ApiKeyRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "api_keys", ApiKeyRecord)

    async def put(self, rec: ApiKeyRecord) -> None:
        await self._upsert(rec.key_hash, rec)

    async def get(self, key_hash: str) -> ApiKeyRecord | None:
        return await self._get(key_hash)


class MongoEventRepo(_Collection[EventRecord]):
    """Events are keyed by their ``seq`` (a unique index), taken from a counter in ``meta``.

    Seqs increase in the order they are taken; with several writers an event may become visible
    after one with a higher seq, so a reader paging by ``after_seq`` can, rarely, step over it.
    Only the leader Master writes events, which keeps that window to its own concurrent appends.
    """

    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "events", EventRecord)

    async def _take_seqs(self, count: int) -> int:
        """Reserve ``count`` seqs; returns the first."""
        counter = await self._conn.db.meta.find_one_and_update(
            {"_id": "event_seq"}, {"$inc": {"value": count}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert counter is not None
        return int(counter["value"]) - count + 1

    @staticmethod
    def _numbered(rec: EventRecord, seq: int) -> dict[str, Any]:
        return {**_document(rec), "seq": seq}

    async def append(self, rec: EventRecord) -> int:
        seq = await self._take_seqs(1)
        await self._c.insert_one(self._numbered(rec, seq))
        return seq

    async def append_many(self, recs: Sequence[EventRecord]) -> None:
        if recs:
            first = await self._take_seqs(len(recs))
            await self._c.insert_many([self._numbered(r, first + i) for i, r in enumerate(recs)])

    async def list(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[EventRecord]:
        if limit <= 0:
            return []
        query: dict[str, Any] = {"seq": {"$gt": after_seq}, **_only(subject=subject)}
        if kind_prefix:
            query["kind"] = {"$gte": kind_prefix, "$lt": prefix_upper_bound(kind_prefix)}
        return await self._find(query, [("seq", ASCENDING)], limit)


class MongoRevocationRepo(_Collection[RevocationRecord]):
    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "revocations", RevocationRecord)

    async def put(self, rec: RevocationRecord) -> None:
        await self._upsert(rec.serial, rec)

    async def list(self) -> builtins.list[RevocationRecord]:
        return await self._find({}, [("revoked_at", ASCENDING), ("_id", ASCENDING)])


class MongoRollupRepo(_Collection[TelemetryRollup]):
    """Keyed by ``_id = "<gpu_uuid>:<minute>"``; an index on (gpu_uuid, minute) serves the range queries.

    Upserts by that compound filter instead would need no composite key, but nx-27017 scans the
    collection for each: 10,000 of them took 63 s there, against under 1 s keyed by _id.
    """

    def __init__(self, conn: _Connection) -> None:
        super().__init__(conn, "rollups", TelemetryRollup)

    async def put_many(self, recs: Sequence[TelemetryRollup]) -> None:
        await self._upsert_many([(f"{r.gpu_uuid}:{r.minute}", r) for r in recs])

    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]:
        minute: dict[str, int] = {"$gte": since_minute}
        if until_minute is not None:
            minute["$lt"] = until_minute
        return await self._find({"gpu_uuid": gpu_uuid, "minute": minute}, [("minute", ASCENDING)])


def database_name(url: str) -> str:
    """The database a ``mongodb://`` URL names in its path; ConfigError when it names none."""
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ConfigError(
            f"the MongoDB URL {redacted(url)!r} names no database: add it as the path, e.g. mongodb://host:27017/idlegrid"
        )
    if any(c in name for c in '/\\. "$'):
        raise ConfigError(f'{name!r} is not a valid MongoDB database name (no / \\ . space " or $)')
    return name


def redacted(url: str) -> str:
    """The URL without its credentials, fit for logs and error messages."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


class MongoStore:
    backend = "mongodb"

    def __init__(self, url: str) -> None:
        self._conn = _Connection(url)
        self.agents: AgentRepo = MongoAgentRepo(self._conn)
        self.gpus: GpuRepo = MongoGpuRepo(self._conn)
        self.commands: CommandRepo = MongoCommandRepo(self._conn)
        self.tokens: TokenRepo = MongoTokenRepo(self._conn)
        self.api_keys: ApiKeyRepo = MongoApiKeyRepo(self._conn)
        self.events: EventRepo = MongoEventRepo(self._conn)
        self.revocations: RevocationRepo = MongoRevocationRepo(self._conn)
        self.rollups: RollupRepo = MongoRollupRepo(self._conn)

    @property
    def url(self) -> str:
        return self._conn.url

    @property
    def database(self) -> str:
        return self._conn.database

    def __repr__(self) -> str:
        return f"MongoStore({redacted(self._conn.url)!r})"

    async def open(self) -> None:
        self._conn.connect()
        try:
            await migrate_mongo(self._conn.db)
        except PyMongoError as exc:
            await self.close()
            raise ConfigError(f"cannot open the MongoDB store at {redacted(self._conn.url)}: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._conn.disconnect()

    async def schema_version(self) -> int:
        return await mongo_schema_version(self._conn.db)
