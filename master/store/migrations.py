"""Versioned schema migrations for both backends, numbered alike: version N means the same data shape.

A migration is never edited once released; a change of schema is a new, higher-numbered step.
SQLite records applied steps in ``schema_migrations`` (each step in its own transaction); MongoDB
keeps the version in the ``meta`` collection, and its steps create indexes (idempotent, so two
Masters opening one database at once do no harm).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from common.errors import ConfigError
from master.command_secrets import split
from master.states import FINAL_COMMAND_STATES
from master.store.codec import Document


@dataclass(frozen=True)
class SqliteMigration:
    version: int
    description: str
    statements: tuple[str, ...]
    rewrite: Callable[[sqlite3.Connection], None] | None = None  # records rewritten, in the step's transaction


@dataclass(frozen=True)
class MongoMigration:
    version: int
    description: str
    indexes: dict[str, list[IndexModel]]  # collection name -> indexes to create
    rewrite: Callable[[AsyncDatabase[Document]], Awaitable[None]] | None = None  # idempotent: Masters may race


# --- version 14: finished create commands stored by an older Master lose their secret values -------------------------
# Open commands are sealed by the command ledger when it loads them (it holds the key); a finished one is never sent
# again, so its secret values are replaced by SEALED (master/command_secrets.py) and not kept at all.

_FINISHED = tuple(sorted(s.value for s in FINAL_COMMAND_STATES))


def _without_secrets(doc: Any) -> Document | None:
    """The command document with its spec's secret values gone, or None when it holds none (or is unreadable)."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return None
    stored, _ = split(spec)
    return None if stored == spec else {**doc, "spec": stored, "sealed": ""}


def _forget_finished_secrets_sqlite(conn: sqlite3.Connection) -> None:
    (before,) = conn.execute("PRAGMA secure_delete").fetchone()
    conn.execute("PRAGMA secure_delete = ON")  # the old rows' bytes are zeroed, not left in free space
    try:
        _rewrite_finished_commands(conn)
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(before)}")


def _rewrite_finished_commands(conn: sqlite3.Connection) -> None:
    marks = ", ".join("?" for _ in _FINISHED)
    for command_id, doc in conn.execute(f"SELECT id, doc FROM commands WHERE state IN ({marks})", _FINISHED).fetchall():
        try:
            scrubbed = _without_secrets(json.loads(doc))
        except ValueError:
            continue  # undecodable: quarantined when read, left for an operator
        if scrubbed is not None:
            conn.execute("UPDATE commands SET doc = ? WHERE id = ?", (json.dumps(scrubbed), command_id))


async def _forget_finished_secrets_mongo(db: AsyncDatabase[Document]) -> None:
    async for doc in db.commands.find({"state": {"$in": list(_FINISHED)}, "kind": "create_container"}):
        scrubbed = _without_secrets(doc)
        if scrubbed is not None:
            await db.commands.update_one({"_id": doc["_id"]}, {"$set": {"spec": scrubbed["spec"], "sealed": ""}})


# Every table holds the record as JSON in ``doc``; the other columns are copies of the fields that
# queries filter or sort on, so they can be indexed.
SQLITE_MIGRATIONS: tuple[SqliteMigration, ...] = (
    SqliteMigration(
        1,
        "agents, gpus, commands, tokens, api keys, events, revocations",
        (
            """CREATE TABLE agents (
                id TEXT PRIMARY KEY, provider TEXT NOT NULL, state TEXT NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX agents_by_state ON agents (state, id)",
            "CREATE INDEX agents_by_provider ON agents (provider, id)",
            """CREATE TABLE gpus (
                uuid TEXT PRIMARY KEY, agent_id TEXT NOT NULL, idx INTEGER NOT NULL, model TEXT NOT NULL,
                state TEXT NOT NULL, tier TEXT, doc TEXT NOT NULL)""",
            "CREATE INDEX gpus_by_agent ON gpus (agent_id, idx)",
            "CREATE INDEX gpus_by_tier ON gpus (tier)",
            "CREATE INDEX gpus_by_state ON gpus (state)",
            "CREATE INDEX gpus_by_model ON gpus (model)",
            """CREATE TABLE commands (
                id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL,
                doc TEXT NOT NULL)""",
            "CREATE INDEX commands_by_created ON commands (created_at)",
            "CREATE INDEX commands_by_agent ON commands (agent_id, created_at)",
            "CREATE INDEX commands_by_state ON commands (state, created_at)",
            """CREATE TABLE tokens (
                token_hash TEXT PRIMARY KEY, expires_at REAL NOT NULL, used_at REAL, doc TEXT NOT NULL)""",
            "CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, doc TEXT NOT NULL)",
            # AUTOINCREMENT: a seq is never reused, even after the newest events are deleted.
            """CREATE TABLE events (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, kind TEXT NOT NULL,
                subject TEXT NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX events_by_subject ON events (subject, seq)",
            "CREATE INDEX events_by_kind ON events (kind, seq)",
            """CREATE TABLE revocations (
                serial TEXT PRIMARY KEY, agent_id TEXT NOT NULL, revoked_at REAL NOT NULL, doc TEXT NOT NULL)""",
        ),
    ),
    SqliteMigration(
        2,
        "telemetry rollups",
        (
            # Keyed and clustered by (gpu, minute): a GPU's history is one contiguous range scan.
            """CREATE TABLE rollups (
                gpu_uuid TEXT NOT NULL, minute INTEGER NOT NULL, doc TEXT NOT NULL,
                PRIMARY KEY (gpu_uuid, minute)) WITHOUT ROWID""",
        ),
    ),
    SqliteMigration(
        3,
        "workloads",
        (
            # ``listed``: aggregates.workload_order(created_at, id), the one column lists sort and page on.
            """CREATE TABLE workloads (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, state TEXT NOT NULL, listed TEXT NOT NULL,
                version INTEGER NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX workloads_by_listed ON workloads (listed)",
            "CREATE INDEX workloads_by_account ON workloads (account, listed)",
            "CREATE INDEX workloads_by_state ON workloads (state, listed)",
        ),
    ),
    SqliteMigration(
        4,
        "accounts; api keys by public key id and by account",
        (
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, role TEXT NOT NULL, doc TEXT NOT NULL)",
            "CREATE INDEX accounts_by_role ON accounts (role, id)",
            "ALTER TABLE api_keys ADD COLUMN key_id TEXT",  # NULL for legacy keys: a unique index lets NULLs repeat
            "ALTER TABLE api_keys ADD COLUMN subject TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE api_keys ADD COLUMN created_at REAL NOT NULL DEFAULT 0",
            """UPDATE api_keys SET subject = COALESCE(json_extract(doc, '$.subject'), ''),
                created_at = COALESCE(json_extract(doc, '$.created_at'), 0)""",
            "CREATE UNIQUE INDEX api_keys_by_key_id ON api_keys (key_id)",
            "CREATE INDEX api_keys_by_subject ON api_keys (subject, created_at, key_id)",
        ),
    ),
    SqliteMigration(
        5,
        "the scheduler's fair-share usage",
        # ``key``: aggregates.fair_share_key(account, project); the table is small (one row per account and project).
        ("CREATE TABLE fair_share (key TEXT PRIMARY KEY, account TEXT NOT NULL, doc TEXT NOT NULL)",),
    ),
    SqliteMigration(
        6,
        "the market: prices, rentals (and their hosts), the ledger (and its lines)",
        (
            # ``key``: aggregates.price_key(provider, agent_id).
            """CREATE TABLE prices (
                key TEXT PRIMARY KEY, provider TEXT NOT NULL, agent_id TEXT NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX prices_by_provider ON prices (provider, agent_id)",
            # ``listed``: rental_order(started_at, id) (management/store/rentals.py), the one column lists sort and page on.
            """CREATE TABLE rentals (
                id TEXT PRIMARY KEY, workload_id TEXT NOT NULL, account TEXT NOT NULL, listed TEXT NOT NULL,
                ended_at REAL, version INTEGER NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX rentals_by_listed ON rentals (listed)",
            "CREATE INDEX rentals_by_account ON rentals (account, listed)",
            "CREATE INDEX rentals_by_workload ON rentals (workload_id, listed)",
            "CREATE INDEX rentals_by_ended ON rentals (ended_at)",
            # One row per host of a rental, written with it: a host's or a provider's rentals by index.
            """CREATE TABLE rental_hosts (
                rental_id TEXT NOT NULL, agent_id TEXT NOT NULL, provider TEXT NOT NULL,
                PRIMARY KEY (rental_id, agent_id, provider)) WITHOUT ROWID""",
            "CREATE INDEX rental_hosts_by_agent ON rental_hosts (agent_id, rental_id)",
            "CREATE INDEX rental_hosts_by_provider ON rental_hosts (provider, rental_id)",
            # AUTOINCREMENT: a seq is never reused. ``key`` unique: an entry is posted once (idempotency).
            """CREATE TABLE ledger (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, rental TEXT NOT NULL,
                doc TEXT NOT NULL)""",
            "CREATE INDEX ledger_by_rental ON ledger (rental, seq)",
            # One row per line, written with its entry: balances and an account's entries without decoding entries.
            """CREATE TABLE ledger_lines (
                seq INTEGER NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)""",
            "CREATE INDEX ledger_lines_by_account ON ledger_lines (account, seq, amount)",  # covering: balances read only it
        ),
    ),
    SqliteMigration(
        7,
        "alerting: rules put through the API, silences, webhooks",
        (
            "CREATE TABLE alert_rules (name TEXT PRIMARY KEY, doc TEXT NOT NULL)",
            "CREATE TABLE silences (id TEXT PRIMARY KEY, created_at REAL NOT NULL, expires_at REAL NOT NULL, doc TEXT NOT NULL)",
            "CREATE INDEX silences_by_created ON silences (created_at, id)",
            "CREATE TABLE webhooks (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, doc TEXT NOT NULL)",
            "CREATE INDEX webhooks_by_owner ON webhooks (owner, created_at, id)",
        ),
    ),
    SqliteMigration(
        8,
        "hourly telemetry rollups",
        (
            # As ``rollups``: a GPU's history is one contiguous range scan; ``minute``: the hour's first minute.
            """CREATE TABLE hourly_rollups (
                gpu_uuid TEXT NOT NULL, minute INTEGER NOT NULL, doc TEXT NOT NULL,
                PRIMARY KEY (gpu_uuid, minute)) WITHOUT ROWID""",
        ),
    ),
    SqliteMigration(
        9,
        "host telemetry rollups, by minute and by hour",
        (
            # As ``rollups``, keyed by host: a host's history is one contiguous range scan.
            """CREATE TABLE host_rollups (
                agent_id TEXT NOT NULL, minute INTEGER NOT NULL, doc TEXT NOT NULL,
                PRIMARY KEY (agent_id, minute)) WITHOUT ROWID""",
            """CREATE TABLE host_hourly_rollups (
                agent_id TEXT NOT NULL, minute INTEGER NOT NULL, doc TEXT NOT NULL,
                PRIMARY KEY (agent_id, minute)) WITHOUT ROWID""",
        ),
    ),
    SqliteMigration(
        10,
        "the leader lease of Masters sharing the store (docs/ha.md)",
        (
            """CREATE TABLE leader_lease (
                name TEXT PRIMARY KEY, holder TEXT NOT NULL, url TEXT NOT NULL, api_url TEXT NOT NULL,
                epoch INTEGER NOT NULL, expires_at REAL NOT NULL)""",
        ),
    ),
    SqliteMigration(
        11,
        "workload containers' output kept after they are deleted",
        (
            """CREATE TABLE outputs (
                id TEXT PRIMARY KEY, workload_id TEXT NOT NULL, state TEXT NOT NULL, ended_at REAL NOT NULL,
                doc TEXT NOT NULL)""",
            "CREATE INDEX outputs_by_workload ON outputs (workload_id)",
            "CREATE INDEX outputs_by_state ON outputs (state, ended_at)",
        ),
    ),
    SqliteMigration(
        12,
        "accounts' SSH public keys (docs/ssh.md)",
        (
            """CREATE TABLE ssh_keys (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, created_at REAL NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX ssh_keys_by_account ON ssh_keys (account, created_at)",
        ),
    ),
    SqliteMigration(
        13,
        "renters' secrets, encrypted (docs/storage.md)",
        (
            """CREATE TABLE secrets (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX secrets_by_account ON secrets (account, name)",
        ),
    ),
    SqliteMigration(
        14,
        "finished create commands keep no secret values (docs/storage.md)",
        (),
        _forget_finished_secrets_sqlite,
    ),
    SqliteMigration(
        15,
        "serverless endpoints and their invocation keys (docs/endpoints.md)",
        (
            """CREATE TABLE endpoints (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, created_at REAL NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX endpoints_by_account ON endpoints (account, created_at)",
            """CREATE TABLE endpoint_keys (
                id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, key_hash TEXT NOT NULL, created_at REAL NOT NULL,
                doc TEXT NOT NULL)""",
            "CREATE INDEX endpoint_keys_by_hash ON endpoint_keys (key_hash)",
            "CREATE INDEX endpoint_keys_by_endpoint ON endpoint_keys (endpoint, created_at)",
        ),
    ),
    SqliteMigration(
        16,
        "requests to serverless endpoints, by state and endpoint in FIFO order (docs/endpoints.md)",
        (
            """CREATE TABLE endpoint_requests (
                id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL, state TEXT NOT NULL, ord INTEGER NOT NULL,
                version INTEGER NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX endpoint_requests_by_state ON endpoint_requests (state, endpoint_id, ord)",
            "CREATE INDEX endpoint_requests_by_endpoint ON endpoint_requests (endpoint_id, ord)",
        ),
    ),
    SqliteMigration(
        17,
        "endpoint requests by when they ended, for the retention sweep (docs/endpoints.md)",
        (
            "ALTER TABLE endpoint_requests ADD COLUMN ended REAL",
            "UPDATE endpoint_requests SET ended = json_extract(doc, '$.ended_at')",
            "CREATE INDEX endpoint_requests_by_end ON endpoint_requests (ended) WHERE ended IS NOT NULL",
        ),
    ),
    SqliteMigration(
        18,
        "money in: renters' top-ups by account, and the payment provider's events acted on, once each (docs/payments.md)",
        (
            """CREATE TABLE topups (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, created_at REAL NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX topups_by_account ON topups (account, created_at)",
            "CREATE INDEX topups_by_creation ON topups (created_at)",
            """CREATE TABLE payment_events (
                id TEXT PRIMARY KEY, received_at REAL NOT NULL, doc TEXT NOT NULL)""",
        ),
    ),
    SqliteMigration(
        19,
        "renters' billing settings: the saved payment method, auto top-up and spend caps, by account (docs/payments.md)",
        ("CREATE TABLE billing (id TEXT PRIMARY KEY, doc TEXT NOT NULL)",),
    ),
    SqliteMigration(
        20,
        "money out: providers' payout accounts, and payouts by account and state, one per period (docs/payments.md)",
        (
            "CREATE TABLE payout_accounts (id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
            """CREATE TABLE payouts (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL,
                doc TEXT NOT NULL)""",
            "CREATE INDEX payouts_by_account ON payouts (account, created_at)",
            "CREATE INDEX payouts_by_state ON payouts (state, created_at)",
        ),
    ),
    SqliteMigration(
        21,
        "renters' disputes of rentals, by renter, provider and rental (docs/disputes.md)",
        (
            """CREATE TABLE disputes (
                id TEXT PRIMARY KEY, rental_id TEXT NOT NULL, account TEXT NOT NULL, provider TEXT NOT NULL,
                created_at REAL NOT NULL, doc TEXT NOT NULL)""",
            "CREATE INDEX disputes_by_account ON disputes (account, created_at)",
            "CREATE INDEX disputes_by_provider ON disputes (provider, created_at)",
            "CREATE INDEX disputes_by_rental ON disputes (rental_id)",
        ),
    ),
)

MONGO_MIGRATIONS: tuple[MongoMigration, ...] = (
    MongoMigration(
        1,
        "agents, gpus, commands, events indexes",
        {
            "agents": [IndexModel([("state", ASCENDING)]), IndexModel([("provider", ASCENDING)])],
            "gpus": [
                IndexModel([("agent_id", ASCENDING), ("index", ASCENDING)]),
                IndexModel([("tier", ASCENDING)]),
                IndexModel([("state", ASCENDING)]),
                IndexModel([("model", ASCENDING)]),
            ],
            "commands": [
                IndexModel([("created_at", DESCENDING)]),
                IndexModel([("agent_id", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("state", ASCENDING), ("created_at", DESCENDING)]),
            ],
            # Keyed by a unique seq rather than by _id: nx-27017 cannot index _id inside a compound index.
            "events": [
                IndexModel([("seq", ASCENDING)], unique=True),
                IndexModel([("subject", ASCENDING), ("seq", ASCENDING)]),
                IndexModel([("kind", ASCENDING), ("seq", ASCENDING)]),
            ],
        },
    ),
    MongoMigration(
        2,
        "telemetry rollups by (gpu_uuid, minute)",
        {"rollups": [IndexModel([("gpu_uuid", ASCENDING), ("minute", ASCENDING)])]},
    ),
    MongoMigration(
        3,
        "workloads by listing order, account and state",
        {
            "workloads": [
                IndexModel([("listed", DESCENDING)]),
                IndexModel([("account", ASCENDING), ("listed", DESCENDING)]),
                IndexModel([("state", ASCENDING), ("listed", DESCENDING)]),
            ]
        },
    ),
    MongoMigration(
        4,
        "accounts by role; api keys by public key id and by account",
        {
            "accounts": [IndexModel([("role", ASCENDING)])],
            "api_keys": [
                IndexModel([("key_id", ASCENDING)]),
                IndexModel([("subject", ASCENDING), ("created_at", ASCENDING)]),
            ],
        },
    ),
    MongoMigration(
        5,
        "the scheduler's fair-share usage by account",
        {"fair_share": [IndexModel([("account", ASCENDING)])]},
    ),
    MongoMigration(
        6,
        "the market: prices by provider; rentals by order, renter, workload, host, provider and end; the ledger by "
        "seq, ledger account and rental",
        {
            "prices": [IndexModel([("provider", ASCENDING), ("agent_id", ASCENDING)])],
            "rentals": [
                IndexModel([("listed", ASCENDING)]),
                IndexModel([("account", ASCENDING), ("listed", ASCENDING)]),
                IndexModel([("workload_id", ASCENDING), ("listed", ASCENDING)]),
                IndexModel([("host_agents", ASCENDING), ("listed", ASCENDING)]),  # multikey: one key per host
                IndexModel([("host_providers", ASCENDING), ("listed", ASCENDING)]),
                IndexModel([("ends", ASCENDING)]),
            ],
            # _id is the entry's key (unique: an entry is posted once); seq is unique too.
            "ledger": [
                IndexModel([("seq", ASCENDING)], unique=True),
                IndexModel([("lines.account", ASCENDING), ("seq", ASCENDING)]),  # multikey: one key per line
                IndexModel([("rental", ASCENDING), ("seq", ASCENDING)]),
            ],
        },
    ),
    MongoMigration(
        7,
        # nx-27017 refuses _id in a compound index: ties on creation sort by _id without an index (few records).
        "alerting: silences by creation; webhooks by owner and creation (rules are keyed by name)",
        {
            "silences": [IndexModel([("created_at", ASCENDING)])],
            "webhooks": [IndexModel([("owner", ASCENDING), ("created_at", ASCENDING)])],
        },
    ),
    MongoMigration(
        8,
        "hourly telemetry rollups by (gpu_uuid, minute)",
        {"hourly_rollups": [IndexModel([("gpu_uuid", ASCENDING), ("minute", ASCENDING)])]},
    ),
    MongoMigration(
        9,
        "host telemetry rollups, by minute and by hour, by (agent_id, minute)",
        {
            "host_rollups": [IndexModel([("agent_id", ASCENDING), ("minute", ASCENDING)])],
            "host_hourly_rollups": [IndexModel([("agent_id", ASCENDING), ("minute", ASCENDING)])],
        },
    ),
    # One document keyed by _id (unique already): nothing to index, the step marks the shape.
    MongoMigration(10, "the leader lease of Masters sharing the store (docs/ha.md)", {}),
    MongoMigration(
        11,
        "workload containers' output kept after they are deleted, by workload and by state",
        {"outputs": [IndexModel([("workload_id", ASCENDING)]), IndexModel([("state", ASCENDING), ("ended_at", ASCENDING)])]},
    ),
    MongoMigration(
        12,
        "accounts' SSH public keys by account and creation (docs/ssh.md)",
        {"ssh_keys": [IndexModel([("account", ASCENDING), ("created_at", ASCENDING)])]},
    ),
    MongoMigration(
        13,
        "renters' secrets, encrypted, by account and name (docs/storage.md)",
        {"secrets": [IndexModel([("account", ASCENDING), ("name", ASCENDING)])]},
    ),
    MongoMigration(14, "finished create commands keep no secret values (docs/storage.md)", {}, _forget_finished_secrets_mongo),
    MongoMigration(
        15,
        "serverless endpoints by account and creation; their invocation keys by hash and by endpoint (docs/endpoints.md)",
        {
            "endpoints": [IndexModel([("account", ASCENDING), ("created_at", ASCENDING)])],
            "endpoint_keys": [
                IndexModel([("key_hash", ASCENDING)]),
                IndexModel([("endpoint", ASCENDING), ("created_at", ASCENDING)]),
            ],
        },
    ),
    MongoMigration(
        16,
        "requests to serverless endpoints, by state and endpoint in FIFO order (docs/endpoints.md)",
        {
            "endpoint_requests": [
                IndexModel([("state", ASCENDING), ("endpoint_id", ASCENDING), ("order", ASCENDING)]),
                IndexModel([("endpoint_id", ASCENDING), ("order", ASCENDING)]),
            ]
        },
    ),
    MongoMigration(
        17,
        "endpoint requests by when they ended, for the retention sweep (docs/endpoints.md)",
        {"endpoint_requests": [IndexModel([("ended_at", ASCENDING)])]},
    ),
    MongoMigration(
        18,
        "money in: renters' top-ups by account, and the payment provider's events acted on, once each (docs/payments.md)",
        {
            "topups": [
                IndexModel([("account", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("created_at", DESCENDING)]),
            ],
            # Keyed by _id (the provider and its event id, unique): an event is inserted once. Nothing else to index.
            "payment_events": [IndexModel([("received_at", ASCENDING)])],
        },
    ),
    MongoMigration(
        19,
        "renters' billing settings: the saved payment method, auto top-up and spend caps, by account (docs/payments.md)",
        {},  # keyed by _id (the account) and read by it or in its order: nothing else to index
    ),
    MongoMigration(
        20,
        "money out: providers' payout accounts, and payouts by account and state, one per period (docs/payments.md)",
        {
            # payout_accounts: keyed by _id (the account), read by it or in its order: nothing to index.
            "payouts": [
                IndexModel([("account", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("state", ASCENDING), ("created_at", DESCENDING)]),
            ],
        },
    ),
    MongoMigration(
        21,
        "renters' disputes of rentals, by renter, provider and rental (docs/disputes.md)",
        {
            "disputes": [
                IndexModel([("account", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("provider", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("rental_id", ASCENDING)]),
            ]
        },
    ),
)

LATEST_VERSION = SQLITE_MIGRATIONS[-1].version  # the contract tests check MongoDB reaches it too


def _refuse_newer(found: int, store_name: str) -> None:
    if found > LATEST_VERSION:
        raise ConfigError(
            f"{store_name} has schema version {found}, newer than this idlegrid understands ({LATEST_VERSION}): "
            "upgrade idlegrid, or point it at another store"
        )


def sqlite_schema_version(conn: sqlite3.Connection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(version)


def migrate_sqlite(conn: sqlite3.Connection, *, up_to: int | None = None, store_name: str = "the SQLite store") -> int:
    """Apply the pending steps up to ``up_to`` (default: all); returns the version reached.

    ``conn`` must be in autocommit mode (``isolation_level=None``): each step runs in its own
    ``BEGIN IMMEDIATE`` transaction, which also makes a second process migrating the same file wait
    and then find the step already applied.
    """
    _refuse_newer(sqlite_schema_version(conn), store_name)
    rewritten = False
    for step in SQLITE_MIGRATIONS:
        if up_to is not None and step.version > up_to:
            break
        conn.execute("BEGIN IMMEDIATE")
        try:
            if sqlite_schema_version(conn) < step.version:
                for statement in step.statements:
                    conn.execute(statement)
                if step.rewrite is not None:
                    step.rewrite(conn)
                    rewritten = True
                conn.execute(
                    "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                    (step.version, step.description, time.time()),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    if rewritten:  # the records' old versions leave the WAL (and its file) now, not at some later checkpoint
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sqlite_schema_version(conn)


async def mongo_schema_version(db: AsyncDatabase[Document]) -> int:
    doc = await db.meta.find_one({"_id": "schema"})
    return int(doc["version"]) if doc else 0


async def migrate_mongo(db: AsyncDatabase[Document], *, up_to: int | None = None) -> int:
    """Apply the pending steps up to ``up_to`` (default: all); returns the version reached."""
    current = await mongo_schema_version(db)
    _refuse_newer(current, f"MongoDB database {db.name!r}")
    for step in MONGO_MIGRATIONS:
        if step.version <= current:
            continue
        if up_to is not None and step.version > up_to:
            break
        for collection, indexes in step.indexes.items():
            await db[collection].create_indexes(indexes)
        if step.rewrite is not None:
            await step.rewrite(db)
        # $max: a Master that migrated further meanwhile is not set back.
        await db.meta.update_one({"_id": "schema"}, {"$max": {"version": step.version}}, upsert=True)
        current = step.version
    return await mongo_schema_version(db)
