"""Undecodable records planted in a store's database from outside, as a buggy release or a hand edit leaves them.

Each planted row or document carries the columns (or fields) the store's queries filter and sort on, so
the queries find it, and a body no record type decodes. ``NAN_COMMAND_DOC`` is the command the poisoned-
state incident left behind: its ``timeout_s`` was NaN, which msgspec wrote into the JSON as ``null``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec
import pymongo

from management.store import (
    ALERT_RULES,
    BILLING,
    DISPUTES,
    ENDPOINT_KEYS,
    ENDPOINT_REQUESTS,
    ENDPOINTS,
    FAIR_SHARE,
    LEDGER,
    OUTPUTS,
    PAYMENT_EVENTS,
    PAYOUT_ACCOUNTS,
    PAYOUTS,
    PRICES,
    RENTALS,
    SILENCES,
    SSH_KEYS,
    TOPUPS,
    WEBHOOKS,
    WORKLOADS,
)
from master.records import CommandRecord
from master.store import MongoStore, SqliteStore, Store
from master.store.aggregates import Aggregate, host_rollup_key, rollup_key

KEY = object()  # stands for the planted record's key among the columns below
FAR_FUTURE = 4_000_000_000.0

# The indexed columns of each SQLite table (all but ``doc``, and an event's seq), as the planted row fills them.
_SQLITE_COLUMNS: dict[str, dict[str, Any]] = {
    Aggregate.AGENTS: {"id": KEY, "provider": "prov-a", "state": "ready"},
    Aggregate.GPUS: {"uuid": KEY, "agent_id": "agt-1", "idx": 9, "model": "h100-sxm", "state": "available", "tier": None},
    Aggregate.COMMANDS: {"id": KEY, "agent_id": "agt-1", "state": "pending", "created_at": 1_700_000_000.0},
    Aggregate.TOKENS: {"token_hash": KEY, "expires_at": FAR_FUTURE, "used_at": None},
    Aggregate.API_KEYS: {"key_hash": KEY},
    Aggregate.EVENTS: {"ts": 1_700_000_000.0, "kind": "agent.transition", "subject": KEY},
    Aggregate.REVOCATIONS: {"serial": KEY, "agent_id": "agt-1", "revoked_at": 1_700_000_000.0},
    Aggregate.ROLLUPS: {"gpu_uuid": KEY, "minute": 5},
    Aggregate.HOURLY_ROLLUPS: {"gpu_uuid": KEY, "minute": 120},
    WORKLOADS.name: {"id": KEY, "account": "bob", "state": "queued", "listed": "0|poisoned", "version": 0},
    Aggregate.ACCOUNTS: {"id": KEY, "role": "renter"},
    FAIR_SHARE.name: {"key": KEY, "account": "alice"},
    PRICES.name: {"key": KEY, "provider": "acme", "agent_id": "agt-poisoned"},
    RENTALS.name: {
        "id": KEY,
        "workload_id": "wl-1",
        "account": "alice",
        "listed": "0|poisoned",
        "ended_at": None,
        "version": 0,
    },
    LEDGER.name: {"key": KEY, "rental": "wl-1-a1"},
    ALERT_RULES.name: {"name": KEY},
    SILENCES.name: {"id": KEY, "created_at": 1_700_000_000.0, "expires_at": FAR_FUTURE},
    WEBHOOKS.name: {"id": KEY, "owner": "acme", "created_at": 1_700_000_000.0},
    Aggregate.HOST_ROLLUPS: {"agent_id": KEY, "minute": 5},
    Aggregate.HOST_HOURLY_ROLLUPS: {"agent_id": KEY, "minute": 120},
    OUTPUTS.name: {"id": KEY, "workload_id": "wl-1", "state": "kept", "ended_at": 1_700_000_000.0},
    Aggregate.SECRETS: {"id": KEY, "account": "alice", "name": "poisoned"},
    SSH_KEYS.name: {"id": KEY, "account": "alice", "created_at": 1_700_000_000.0},
    ENDPOINTS.name: {"id": KEY, "account": "alice", "created_at": 1_700_000_000.0},
    ENDPOINT_KEYS.name: {"id": KEY, "endpoint": "ep-1", "key_hash": "0" * 64, "created_at": 1_700_000_000.0},
    ENDPOINT_REQUESTS.name: {"id": KEY, "endpoint_id": "ep-1", "state": "queued", "ord": 1, "version": 1},
    TOPUPS.name: {"id": KEY, "account": "alice", "created_at": 1_700_000_000.0},
    PAYMENT_EVENTS.name: {"id": KEY, "received_at": 1_700_000_000.0},
    BILLING.name: {"id": KEY},
    DISPUTES.name: {"id": KEY, "rental_id": "wl-1-a1", "account": "alice", "provider": "acme", "created_at": 1_700_000_000.0},
    PAYOUT_ACCOUNTS.name: {"id": KEY},
    PAYOUTS.name: {"id": KEY, "account": "alice", "created_at": 1_700_000_000.0, "state": "pending"},
}
# The MongoDB field each SQLite column is kept in, where the names differ; the key column is _id.
_MONGO_FIELD = {"idx": "index", "ord": "order"}
# A field of the wrong type in each planted record (a command's deadline as a NaN was written: null).
_BROKEN: dict[str, dict[str, Any]] = {
    Aggregate.AGENTS: {"host": "not a host"},
    Aggregate.GPUS: {"info": "not GPU info"},
    Aggregate.COMMANDS: {"kind": "create_container", "spec": {}, "deadline": None},
    Aggregate.TOKENS: {"provider": 7, "created_at": 0.0},
    Aggregate.API_KEYS: {"name": "ops", "role": 7, "created_at": 0.0},
    Aggregate.EVENTS: {"data": "not a mapping"},
    Aggregate.REVOCATIONS: {"reason": 7},
    Aggregate.ROLLUPS: {"agent_id": "agt-1", "samples": "many"},
    Aggregate.HOURLY_ROLLUPS: {"agent_id": "agt-1", "samples": "many"},
    WORKLOADS.name: {"account": "bob", "spec": "not a spec", "state": "queued", "created_at": 0.0},
    Aggregate.ACCOUNTS: {"share": "a lot"},
    FAIR_SHARE.name: {"gpu_seconds": "a lot", "decayed_to": 0.0},
    PRICES.name: {"on_demand": "a lot"},
    RENTALS.name: {"kind": "on_demand", "hosts": "not hosts", "started_at": 0.0},
    LEDGER.name: {"ts": 0.0, "kind": "charge", "memo": "", "lines": "not lines"},
    ALERT_RULES.name: {"spec": "not a mapping", "updated_at": 0.0, "updated_by": "operator"},
    SILENCES.name: {"created_by": "operator", "labels": "not labels"},
    WEBHOOKS.name: {"url": "https://hooks.example/x", "secret": 7, "role": "provider"},
    Aggregate.HOST_ROLLUPS: {"samples": "many"},
    Aggregate.HOST_HOURLY_ROLLUPS: {"samples": "many"},
    OUTPUTS.name: {"replica": "the first", "attempt": 1, "account": "alice", "agent_id": "agt-1", "container": "c"},
    Aggregate.SECRETS: {"sealed": 7, "created_at": 0.0},
    SSH_KEYS.name: {"name": "laptop", "public_key": 7, "fingerprint": "SHA256:x"},
    ENDPOINTS.name: {"spec": "not a spec", "updated_at": 0.0},
    ENDPOINT_KEYS.name: {"account": "alice", "name": 7},
    ENDPOINT_REQUESTS.name: {"input": 7, "attempt": "first"},
    TOPUPS.name: {"amount": "a lot", "currency": "USD", "provider": "stripe", "reference": "pi_1"},
    PAYMENT_EVENTS.name: {"provider": "stripe", "event_id": 7, "kind": "payment_intent.succeeded", "outcome": "credited"},
    BILLING.name: {"customer": "cus_1", "caps": "no caps"},
    DISPUTES.name: {"workload_id": "wl-1", "agent_id": "agt-1", "reason": 7, "disputable": "all"},
    PAYOUT_ACCOUNTS.name: {"provider": "stripe", "reference": 7},
    PAYOUTS.name: {"period": "2026-W49", "amount": "a lot", "currency": "USD", "destination": "acct_1"},
}
_HOST_ROLLUPS = (Aggregate.HOST_ROLLUPS, Aggregate.HOST_HOURLY_ROLLUPS)


def nan_command_doc(command_id: str, created_at: float) -> str:
    """A command as the version before the fix stored it when created with timeout_s NaN."""
    rec = CommandRecord(
        id=command_id, agent_id="agt-1", kind="create_container", spec={}, state="pending", created_at=created_at, deadline=0.0
    )
    rec.deadline = float("nan")  # as created_at + NaN was
    return msgspec.json.encode(rec).decode()


def _columns(aggregate: str, key: str, overrides: dict[str, Any]) -> dict[str, Any]:
    columns = {name: (key if value is KEY else value) for name, value in _SQLITE_COLUMNS[aggregate].items()}
    return columns | overrides


def _undecodable(aggregate: str, columns: dict[str, Any]) -> dict[str, Any]:
    """A record body with the planted row's columns and one field of the wrong type."""
    return {_MONGO_FIELD.get(name, name): value for name, value in columns.items()} | _BROKEN[aggregate]


def poison_sqlite(path: str, aggregate: str, key: str, *, doc: str | None = None, **overrides: Any) -> str:
    """Plant an undecodable row; returns the key the store will report it under (an event's seq for events)."""
    columns = _columns(aggregate, key, overrides)
    columns["doc"] = doc if doc is not None else msgspec.json.encode(_undecodable(aggregate, columns)).decode()
    names = ", ".join(columns)
    marks = ", ".join("?" for _ in columns)
    with sqlite3.connect(path, isolation_level=None) as conn:
        cursor = conn.execute(f"INSERT INTO {aggregate} ({names}) VALUES ({marks})", list(columns.values()))
    conn.close()
    if aggregate == Aggregate.EVENTS:
        return str(cursor.lastrowid)
    if aggregate in (Aggregate.ROLLUPS, Aggregate.HOURLY_ROLLUPS):
        return rollup_key(key, columns["minute"])
    if aggregate in _HOST_ROLLUPS:
        return host_rollup_key(key, columns["minute"])
    return key


async def poison_mongo(url: str, database: str, aggregate: str, key: str, **overrides: Any) -> str:
    """Plant an undecodable document; returns the key the store will report it under."""
    columns = _columns(aggregate, key, overrides)
    doc = _undecodable(aggregate, columns)
    async with pymongo.AsyncMongoClient[dict[str, Any]](url) as client:
        db = client[database]
        if aggregate == Aggregate.EVENTS:  # numbered from the store's own counter, so later appends do not collide
            counter = await db.meta.find_one_and_update(
                {"_id": "event_seq"}, {"$inc": {"value": 1}}, upsert=True, return_document=pymongo.ReturnDocument.AFTER
            )
            assert counter is not None
            doc["seq"] = counter["value"]
            reported = str(counter["value"])
        else:
            if aggregate == LEDGER.name:  # numbered like the store numbers entries, so lists by seq find it
                counter = await db.meta.find_one_and_update(
                    {"_id": "ledger_seq"}, {"$inc": {"value": 1}}, upsert=True, return_document=pymongo.ReturnDocument.AFTER
                )
                assert counter is not None
                doc["seq"] = counter["value"]
            rollups = (Aggregate.ROLLUPS, Aggregate.HOURLY_ROLLUPS)
            reported = rollup_key(key, columns["minute"]) if aggregate in rollups else key
            if aggregate in _HOST_ROLLUPS:
                reported = host_rollup_key(key, columns["minute"])
            doc["_id"] = reported
        await db[aggregate].insert_one(doc)
    return reported


async def poison(store: Store, aggregate: str, key: str, **overrides: Any) -> str:
    """Plant an undecodable record in ``store``'s database (SQLite or MongoDB); returns the key it is reported under."""
    if isinstance(store, SqliteStore):
        return poison_sqlite(store.path, aggregate, key, **overrides)
    assert isinstance(store, MongoStore)
    return await poison_mongo(store.url, store.database, aggregate, key, **overrides)
