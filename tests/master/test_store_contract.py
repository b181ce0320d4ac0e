"""The store contract: every backend (SQLite, MongoDB on nx-27017, and a real mongod when MONGODB_URI is set)
behaves the same. Fixtures are in conftest.py."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pymongo
import pytest

from common.errors import ConfigError
from common.inventory import GpuInfo, HostInfo, MigInstance, NvLink
from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    Assignment,
    CommandRecord,
    EventRecord,
    FairShareUsage,
    GpuFault,
    GpuRecord,
    PlacementConstraints,
    ReplicaSpec,
    RevocationRecord,
    TelemetryRollup,
    TokenRecord,
    WorkloadRecord,
    WorkloadSpec,
)
from master.store import MongoStore, SqliteStore, open_store
from master.store.aggregates import workload_order
from master.store.base import Store, TokenOutcome
from master.store.errors import DuplicateWorkload, StaleWorkload, UnstorableRecord
from master.store.migrations import LATEST_VERSION, MONGO_MIGRATIONS, migrate_mongo, migrate_sqlite
from tests.master.conftest import OpenStore
from tests.support.grid import free_port

NOW = 1_700_000_000.25


def assert_same(got: Any, want: Any) -> None:
    """Equal, and of the same types field by field: True stays True (not 1), 2.0 stays 2.0 (not 2)."""
    assert got == want
    assert msgspec.json.encode(got, order="deterministic") == msgspec.json.encode(want, order="deterministic")


def raw_client(url: str) -> pymongo.AsyncMongoClient[dict[str, Any]]:
    """A client of its own, for looking at (or tampering with) a MongoDB store's database from outside."""
    return pymongo.AsyncMongoClient(url)


def host(**overrides: Any) -> HostInfo:
    fields: dict[str, Any] = dict(
        hostname="rig-7",
        cpu_model="AMD EPYC 9354",
        cpu_cores=64,
        ram_mib=515_000,
        disk_total_gib=3725.5,
        disk_free_gib=2048.25,
        os="Debian 12",
        kernel="6.1.0-18-amd64",
        bandwidth_mbps_down=940.5,
        bandwidth_mbps_up=480.0,
        latency_ms=None,
    )
    return HostInfo(**(fields | overrides))


def gpu_info(uuid: str, index: int = 0, **overrides: Any) -> GpuInfo:
    fields: dict[str, Any] = dict(
        index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{index:02x}:00.0",
        memory_total_mib=81_559,
        compute_capability="9.0",
        driver_version="550.54.15",
        cuda_version="12.4",
        pcie_gen=5,
        pcie_width=16,
        nvlinks=[NvLink(link=0, active=True, remote_pci_bus_id="00000000:1b:00.0"), NvLink(link=1, active=False)],
        clock_sm_max_mhz=1980,
        clock_mem_max_mhz=2619,
        power_limit_w=700.0,
        memory_bus_width_bits=5120,
        simulated=True,
    )
    return GpuInfo(**(fields | overrides))


def agent(agent_id: str = "agt-1", **overrides: Any) -> AgentRecord:
    fields: dict[str, Any] = dict(
        id=agent_id,
        provider="prov-a",
        state="ready",
        region="eu-west",
        relay="relay-1",
        cert_serial="1f2e3d",
        cert_not_after=NOW + 86_400,
        host=host(),
        simulated=True,
        enrolled_at=NOW - 3600,
        last_seen=NOW,
        connected_since=NOW - 60,
        uptime_s=3540.5,
        downtime_s=0.0,
        commands_succeeded=12,
        commands_failed=1,
        drained=False,
        containers={"ig-job-1": ["GPU-a", "GPU-b"]},
        state_reason="connected through relay-1",
        version=3,
    )
    return AgentRecord(**(fields | overrides))


def gpu(uuid: str, agent_id: str = "agt-1", index: int = 0, **overrides: Any) -> GpuRecord:
    fields: dict[str, Any] = dict(
        uuid=uuid,
        agent_id=agent_id,
        index=index,
        model="h100-sxm",
        info=gpu_info(uuid, index),
        state="available",
        tier="premium",
        flags=["nvlink_partial"],
        updated_at=NOW,
    )
    return GpuRecord(**(fields | overrides))


def command(
    command_id: str, created_at: float, agent_id: str = "agt-1", state: str = "pending", **overrides: Any
) -> CommandRecord:
    fields: dict[str, Any] = dict(
        id=command_id,
        agent_id=agent_id,
        kind="create_container",
        spec={"name": "ig-job-1", "image": "busybox", "gpus": ["GPU-a"], "env": {"A": "1"}, "limits": {"cpus": 2.5}},
        state=state,
        created_at=created_at,
        deadline=created_at + 300,
        signature="c2lnbmF0dXJl",
        key_id="k1",
    )
    return CommandRecord(**(fields | overrides))


def token(token_hash: str = "h" * 64, expires_at: float = NOW + 3600, **overrides: Any) -> TokenRecord:
    return TokenRecord(token_hash=token_hash, provider="prov-a", created_at=NOW, expires_at=expires_at, **overrides)


def event(kind: str, subject: str, ts: float = NOW, **data: Any) -> EventRecord:
    return EventRecord(ts=ts, kind=kind, subject=subject, data=data)


def rollup(gpu_uuid: str, minute: int, samples: int = 6, **overrides: Any) -> TelemetryRollup:
    fields: dict[str, Any] = dict(
        gpu_uuid=gpu_uuid,
        agent_id="agt-1",
        minute=minute,
        samples=samples,
        utilization_avg=41.5,
        utilization_max=97.0,
        memory_used_mib_max=40_960,
        temperature_max=71.0,
        power_avg_w=455.25,
        ecc_uncorrected=0,
    )
    return TelemetryRollup(**(fields | overrides))


# --- agents -----------------------------------------------------------------------------------------


async def test_agent_round_trips_every_field_including_host_info(store: Store) -> None:
    rec = agent()
    await store.agents.put(rec)
    assert_same(await store.agents.get("agt-1"), rec)


async def test_unknown_agent_is_none(store: Store) -> None:
    assert await store.agents.get("agt-nope") is None


async def test_putting_an_agent_again_replaces_it(store: Store) -> None:
    await store.agents.put(agent())
    changed = agent(state="offline", host=None, simulated=False, drained=True, connected_since=None, containers={})
    await store.agents.put(changed)
    assert_same(await store.agents.get("agt-1"), changed)
    assert await store.agents.list() == [changed]


async def test_agent_put_many_inserts_and_replaces_in_one_batch(store: Store) -> None:
    await store.agents.put(agent("agt-1"))
    replaced = agent("agt-1", state="offline", drained=True)
    await store.agents.put_many([replaced, agent("agt-2", provider="prov-b")])
    assert_same(await store.agents.get("agt-1"), replaced)
    assert [a.id for a in await store.agents.list()] == ["agt-1", "agt-2"]
    await store.agents.put_many([])  # nothing to write is not an error
    assert len(await store.agents.list()) == 2


async def test_a_stored_agent_is_a_copy_of_the_callers_record(store: Store) -> None:
    rec = agent()
    await store.agents.put(rec)
    rec.state = "busy"
    stored = await store.agents.get("agt-1")
    assert stored is not None and stored.state == "ready"


async def test_agents_filter_by_state_and_provider_ordered_by_id(store: Store) -> None:
    for rec in [agent("agt-3", state="ready"), agent("agt-1", state="offline"), agent("agt-2", provider="prov-b")]:
        await store.agents.put(rec)
    assert [a.id for a in await store.agents.list()] == ["agt-1", "agt-2", "agt-3"]
    assert [a.id for a in await store.agents.list(state="ready")] == ["agt-2", "agt-3"]
    assert [a.id for a in await store.agents.list(provider="prov-b")] == ["agt-2"]
    assert [a.id for a in await store.agents.list(state="ready", provider="prov-a")] == ["agt-3"]
    assert await store.agents.list(state="retired") == []


# --- gpus -------------------------------------------------------------------------------------------


async def test_gpu_round_trips_nested_gpu_info_with_nvlinks(store: Store) -> None:
    rec = gpu("GPU-a")
    await store.gpus.put_many([rec])
    assert_same(await store.gpus.get("GPU-a"), rec)
    assert await store.gpus.get("GPU-nope") is None


async def test_gpu_round_trips_its_mig_instances(store: Store) -> None:
    instances = [
        MigInstance(uuid="MIG-a-0", profile="3g.40gb", memory_mib=40448, gpu_instance_id=1, compute_instance_id=0, index=0),
        MigInstance(uuid="MIG-a-1", profile="1g.10gb+me", memory_mib=9984, index=1),
    ]
    rec = gpu("GPU-a", info=gpu_info("GPU-a", mig_enabled=True, mig_instances=tuple(instances)))
    await store.gpus.put_many([rec])
    assert_same(await store.gpus.get("GPU-a"), rec)


async def test_gpu_put_many_upserts_by_uuid(store: Store) -> None:
    await store.gpus.put_many([gpu("GPU-a"), gpu("GPU-b", index=1)])
    moved = gpu("GPU-a", state="faulty", tier=None, flags=[], info=gpu_info("GPU-a", simulated=False, nvlinks=[]))
    await store.gpus.put_many([moved, gpu("GPU-c", index=2)])
    assert_same(await store.gpus.get("GPU-a"), moved)
    assert [g.uuid for g in await store.gpus.list()] == ["GPU-a", "GPU-b", "GPU-c"]


async def test_gpu_put_many_of_nothing_is_a_no_op(store: Store) -> None:
    await store.gpus.put_many([])
    assert await store.gpus.list() == []


async def test_gpus_filter_by_agent_tier_state_and_model(store: Store) -> None:
    await store.gpus.put_many(
        [
            gpu("GPU-b1", "agt-2", 1, tier="standard", model="a100-pcie"),
            gpu("GPU-b0", "agt-2", 0, state="busy"),
            gpu("GPU-a0", "agt-1", 0, tier=None, model=""),
        ]
    )
    assert [g.uuid for g in await store.gpus.list()] == ["GPU-a0", "GPU-b0", "GPU-b1"]  # by agent, then index
    assert [g.uuid for g in await store.gpus.list(agent_id="agt-2")] == ["GPU-b0", "GPU-b1"]
    assert [g.uuid for g in await store.gpus.list(tier="premium")] == ["GPU-b0"]
    assert [g.uuid for g in await store.gpus.list(state="available")] == ["GPU-a0", "GPU-b1"]
    assert [g.uuid for g in await store.gpus.list(model="a100-pcie")] == ["GPU-b1"]
    assert [g.uuid for g in await store.gpus.list(agent_id="agt-2", state="available", model="a100-pcie")] == ["GPU-b1"]
    assert await store.gpus.list(agent_id="agt-1", state="busy") == []


# --- commands ---------------------------------------------------------------------------------------


async def test_command_round_trips_spec_and_result(store: Store) -> None:
    rec = command(
        "cmd-1",
        NOW,
        state="succeeded",
        sent_at=NOW + 1,
        acked_at=NOW + 1.5,
        finished_at=NOW + 9,
        attempts=2,
        result={"container_id": "abc", "ok": True, "ports": [8080], "extra": None},
    )
    await store.commands.put(rec)
    assert_same(await store.commands.get("cmd-1"), rec)
    assert await store.commands.get("cmd-nope") is None


async def test_putting_a_command_again_replaces_it(store: Store) -> None:
    await store.commands.put(command("cmd-1", NOW))
    failed = command("cmd-1", NOW, state="failed", error="image not found", result={"error_code": "runtime_failure"})
    await store.commands.put(failed)
    assert_same(await store.commands.get("cmd-1"), failed)
    assert len(await store.commands.list()) == 1


async def test_commands_list_newest_first_up_to_the_limit(store: Store) -> None:
    for i in [2, 0, 3, 1]:
        await store.commands.put(command(f"cmd-{i}", NOW + i))
    assert [c.id for c in await store.commands.list()] == ["cmd-3", "cmd-2", "cmd-1", "cmd-0"]
    assert [c.id for c in await store.commands.list(limit=2)] == ["cmd-3", "cmd-2"]
    assert await store.commands.list(limit=0) == []


async def test_commands_filter_by_states_and_agent(store: Store) -> None:
    await store.commands.put(command("cmd-1", NOW + 1, "agt-1", "pending"))
    await store.commands.put(command("cmd-2", NOW + 2, "agt-1", "succeeded"))
    await store.commands.put(command("cmd-3", NOW + 3, "agt-2", "sent"))
    await store.commands.put(command("cmd-4", NOW + 4, "agt-1", "acked"))
    live = {"pending", "sent", "acked"}
    assert [c.id for c in await store.commands.list(states=live)] == ["cmd-4", "cmd-3", "cmd-1"]
    assert [c.id for c in await store.commands.list(agent_id="agt-1")] == ["cmd-4", "cmd-2", "cmd-1"]
    assert [c.id for c in await store.commands.list(agent_id="agt-1", states=["pending", "sent"])] == ["cmd-1"]
    assert await store.commands.list(states=[]) == []


# --- join tokens ------------------------------------------------------------------------------------


async def test_a_token_is_consumed_once(store: Store) -> None:
    await store.tokens.put(token())
    outcome, spent = await store.tokens.consume("h" * 64, agent_id="agt-1", now=NOW)
    assert outcome is TokenOutcome.OK
    assert_same(spent, token(used_at=NOW, used_by="agt-1"))
    outcome, again = await store.tokens.consume("h" * 64, agent_id="agt-2", now=NOW + 1)
    assert outcome is TokenOutcome.USED
    assert again is not None and again.used_by == "agt-1"


async def test_of_concurrent_consumers_on_separate_connections_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]  # as four Master processes would race
    await stores[0].tokens.put(token())
    attempts = [store.tokens.consume("h" * 64, agent_id=f"agt-{i}", now=NOW) for i, store in enumerate(stores * 4)]
    results = await asyncio.gather(*attempts)
    outcomes = [outcome for outcome, _ in results]
    assert outcomes.count(TokenOutcome.OK) == 1
    assert outcomes.count(TokenOutcome.USED) == len(attempts) - 1
    winner = outcomes.index(TokenOutcome.OK)
    spent = results[winner][1]
    assert spent is not None and spent.used_by == f"agt-{winner}"


async def test_an_expired_token_is_refused_and_left_unspent(store: Store) -> None:
    await store.tokens.put(token(expires_at=NOW))
    outcome, rec = await store.tokens.consume("h" * 64, agent_id="agt-1", now=NOW)  # expiry is exclusive
    assert outcome is TokenOutcome.EXPIRED
    assert rec is not None and rec.used_at is None
    outcome, _ = await store.tokens.consume("h" * 64, agent_id="agt-1", now=NOW - 1)  # so it is still unspent
    assert outcome is TokenOutcome.OK


async def test_a_used_token_stays_used_after_it_expires(store: Store) -> None:
    await store.tokens.put(token(expires_at=NOW + 10))
    await store.tokens.consume("h" * 64, agent_id="agt-1", now=NOW)
    outcome, _ = await store.tokens.consume("h" * 64, agent_id="agt-2", now=NOW + 20)
    assert outcome is TokenOutcome.USED


async def test_an_unknown_token_is_unknown(store: Store) -> None:
    await store.tokens.put(token())
    assert await store.tokens.consume("x" * 64, agent_id="agt-1", now=NOW) == (TokenOutcome.UNKNOWN, None)


# --- API keys ---------------------------------------------------------------------------------------


async def test_api_key_round_trips_and_put_replaces(store: Store) -> None:
    key = ApiKeyRecord(key_hash="k" * 64, name="ops", role="operator", created_at=NOW)
    await store.api_keys.put(key)
    assert_same(await store.api_keys.get("k" * 64), key)
    renamed = ApiKeyRecord(key_hash="k" * 64, name="ops-2", role="operator", created_at=NOW, subject="prov-a")
    await store.api_keys.put(renamed)
    assert_same(await store.api_keys.get("k" * 64), renamed)
    assert await store.api_keys.get("z" * 64) is None


async def test_api_keys_are_found_by_public_key_id_and_listed_by_account_oldest_first(store: Store) -> None:
    def key(n: int, subject: str, **overrides: Any) -> ApiKeyRecord:
        fields: dict[str, Any] = dict(
            key_hash=f"{n:064x}", name=f"k{n}", role="", created_at=NOW + 10 - n, subject=subject, key_id=f"key-{n}"
        )
        return ApiKeyRecord(**(fields | overrides))

    for rec in (
        key(1, "acme"),
        key(2, "acme"),
        key(3, "bob"),
        ApiKeyRecord(key_hash="e" * 64, name="legacy", role="operator", created_at=NOW),
    ):
        await store.api_keys.put(rec)
    assert_same(await store.api_keys.by_key_id("key-3"), key(3, "bob"))
    assert await store.api_keys.by_key_id("key-9") is None
    assert await store.api_keys.by_key_id("") is None  # legacy keys have no public id and are never found by one
    assert [k.key_id for k in await store.api_keys.list(subject="acme")] == ["key-2", "key-1"]
    revoked = key(2, "acme", revoked_at=NOW + 20, last_used=NOW + 19)
    await store.api_keys.put(revoked)
    assert_same(await store.api_keys.list(subject="acme"), [revoked, key(1, "acme")])
    assert [k.name for k in await store.api_keys.list(subject="")] == ["legacy"]
    assert await store.api_keys.list(subject="nobody") == []


async def test_marking_a_key_used_sets_last_used_only_and_keeps_a_revocation(store: Store) -> None:
    key = ApiKeyRecord(key_hash="k" * 64, name="ci", role="", created_at=NOW, subject="acme", key_id="key-1")
    await store.api_keys.put(msgspec.structs.replace(key, revoked_at=NOW + 1))  # written by another Master meanwhile
    await store.api_keys.mark_used("k" * 64, NOW + 2)
    assert_same(await store.api_keys.get("k" * 64), msgspec.structs.replace(key, revoked_at=NOW + 1, last_used=NOW + 2))
    await store.api_keys.mark_used("z" * 64, NOW + 2)
    assert await store.api_keys.get("z" * 64) is None


# --- accounts ---------------------------------------------------------------------------------------


def account(account_id: str, role: str = "renter", **overrides: Any) -> AccountRecord:
    fields: dict[str, Any] = dict(id=account_id, role=role, name=account_id.title(), created_at=NOW)
    return AccountRecord(**(fields | overrides))


async def test_an_account_round_trips_every_field(store: Store) -> None:
    full = account(
        "lab-7", share=2.5, project_shares={"vision": 3.0, "nlp": 1.0}, gpu_quota=16, tier_quotas={"h100": 8}, disabled=True
    )
    assert await store.accounts.add(full)
    assert_same(await store.accounts.get("lab-7"), full)
    assert await store.accounts.get("lab-8") is None


async def test_adding_a_taken_account_id_is_refused_and_changes_nothing(store: Store) -> None:
    assert await store.accounts.add(account("acme", "provider"))
    assert not await store.accounts.add(account("acme", "renter", name="Impostor"))
    assert_same(await store.accounts.get("acme"), account("acme", "provider"))


async def test_of_concurrent_adds_of_one_account_id_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(3)]
    won = await asyncio.gather(*(s.accounts.add(account("acme", name=f"try {i}")) for i, s in enumerate(stores)))
    assert sorted(won) == [False, False, True]


async def test_putting_an_account_replaces_it_and_moves_it_between_roles(store: Store) -> None:
    await store.accounts.add(account("acme", "provider"))
    changed = account("acme", "renter", disabled=True, gpu_quota=0, updated_at=NOW + 1)
    await store.accounts.put(changed)
    assert_same(await store.accounts.get("acme"), changed)
    assert await store.accounts.list(role="provider") == []
    assert [a.id for a in await store.accounts.list(role="renter")] == ["acme"]


async def test_accounts_list_by_role_in_id_order_after_a_cursor_up_to_a_limit(store: Store) -> None:
    for account_id, role in (
        ("zed", "renter"),
        ("acme", "provider"),
        ("bob", "renter"),
        ("ops", "operator"),
        ("carol", "renter"),
    ):
        await store.accounts.add(account(account_id, role))
    assert [a.id for a in await store.accounts.list()] == ["acme", "bob", "carol", "ops", "zed"]
    assert [a.id for a in await store.accounts.list(role="renter")] == ["bob", "carol", "zed"]
    assert [a.id for a in await store.accounts.list(role="renter", after="bob", limit=1)] == ["carol"]
    assert [a.id for a in await store.accounts.list(after="ops")] == ["zed"]


# --- events -----------------------------------------------------------------------------------------


async def test_event_seqs_increase_across_append_and_append_many(store: Store) -> None:
    first = await store.events.append(event("agent.enrolled", "agt-1"))
    await store.events.append_many([event("gpu.classified", "GPU-a"), event("gpu.classified", "GPU-b")])
    last = await store.events.append(event("agent.transition", "agt-1"))
    seqs = [e.seq for e in await store.events.list()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert seqs[0] == first and seqs[-1] == last and first > 0
    assert [e.subject for e in await store.events.list()] == ["agt-1", "GPU-a", "GPU-b", "agt-1"]


async def test_events_round_trip_with_their_data(store: Store) -> None:
    rec = event("agent.transition", "agt-1", old="ready", new="busy", event="assign", gpus=["GPU-a"], score=0.5)
    seq = await store.events.append(rec)
    (got,) = await store.events.list()
    assert_same(got, msgspec.structs.replace(rec, seq=seq))


async def test_events_page_by_after_seq_in_ascending_order(store: Store) -> None:
    await store.events.append_many([event("agent.heartbeat", "agt-1", ts=NOW + i, n=i) for i in range(7)])
    page1 = await store.events.list(limit=3)
    page2 = await store.events.list(after_seq=page1[-1].seq, limit=3)
    page3 = await store.events.list(after_seq=page2[-1].seq, limit=3)
    assert [e.data["n"] for e in page1 + page2 + page3] == list(range(7))
    assert await store.events.list(after_seq=page3[-1].seq) == []
    assert await store.events.list(limit=0) == []


async def test_events_filter_by_subject_and_kind_prefix(store: Store) -> None:
    kinds = ["agent.transition", "gpu.transition", "agentx.other", "agent-transition", "agent.revoked", "agent."]
    await store.events.append_many([event(kind, "agt-1" if i % 2 else "agt-2") for i, kind in enumerate(kinds)])
    # The prefix is literal: "." is no wildcard and "agent" alone would also match "agentx".
    by_prefix = await store.events.list(kind_prefix="agent.")
    assert [e.kind for e in by_prefix] == ["agent.transition", "agent.revoked", "agent."]
    by_subject = await store.events.list(subject="agt-1")
    assert [e.kind for e in by_subject] == ["gpu.transition", "agent-transition", "agent."]
    assert [e.kind for e in await store.events.list(subject="agt-1", kind_prefix="agent.")] == ["agent."]
    assert len(await store.events.list(kind_prefix="")) == len(kinds)


# --- revocations ------------------------------------------------------------------------------------


async def test_revocations_list_oldest_first_and_upsert_by_serial(store: Store) -> None:
    late = RevocationRecord(serial="0b", agent_id="agt-2", revoked_at=NOW + 5, reason="key compromised")
    early = RevocationRecord(serial="0a", agent_id="agt-1", revoked_at=NOW)
    await store.revocations.put(late)
    await store.revocations.put(early)
    assert_same(await store.revocations.list(), [early, late])
    again = RevocationRecord(serial="0b", agent_id="agt-2", revoked_at=NOW + 5, reason="retired by operator")
    await store.revocations.put(again)
    assert_same(await store.revocations.list(), [early, again])


# --- telemetry rollups ------------------------------------------------------------------------------


async def test_rollups_round_trip_and_upsert_by_gpu_and_minute(store: Store) -> None:
    await store.rollups.put_many([rollup("GPU-a", 100), rollup("GPU-a", 101), rollup("GPU-b", 100)])
    redone = rollup("GPU-a", 101, samples=12, temperature_max=None, power_avg_w=None, ecc_uncorrected=2)
    await store.rollups.put_many([redone])
    assert_same(await store.rollups.list("GPU-a"), [rollup("GPU-a", 100), redone])
    assert_same(await store.rollups.list("GPU-b"), [rollup("GPU-b", 100)])


async def test_rollups_range_is_since_inclusive_until_exclusive(store: Store) -> None:
    await store.rollups.put_many([rollup("GPU-a", m) for m in [13, 10, 12, 11]] + [rollup("GPU-b", 11)])
    assert [r.minute for r in await store.rollups.list("GPU-a")] == [10, 11, 12, 13]
    assert [r.minute for r in await store.rollups.list("GPU-a", since_minute=11)] == [11, 12, 13]
    assert [r.minute for r in await store.rollups.list("GPU-a", since_minute=11, until_minute=13)] == [11, 12]
    assert [r.minute for r in await store.rollups.list("GPU-a", until_minute=11)] == [10]
    assert await store.rollups.list("GPU-c") == []


async def test_a_large_rollup_batch_is_written_whole(store: Store) -> None:
    batch = [rollup(f"GPU-{g}", m) for g in range(20) for m in range(50)]
    await store.rollups.put_many(batch)
    assert [r.minute for r in await store.rollups.list("GPU-7")] == list(range(50))


# --- schema and migrations --------------------------------------------------------------------------


async def test_a_new_store_is_at_the_latest_schema_version(store: Store) -> None:
    assert await store.schema_version() == LATEST_VERSION == MONGO_MIGRATIONS[-1].version


async def test_reopening_a_store_keeps_its_data_and_schema_version(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await first.agents.put(agent())
    seq = await first.events.append(event("agent.enrolled", "agt-1"))
    version = await first.schema_version()
    await first.close()

    second = open_store(store_url)
    await second.open()
    try:
        assert await second.schema_version() == version
        assert_same(await second.agents.get("agt-1"), agent())
        assert await second.events.append(event("agent.transition", "agt-1")) > seq  # seqs continue, never reused
    finally:
        await second.close()


async def test_an_sqlite_file_written_by_schema_version_1_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path, isolation_level=None) as conn:  # what an idlegrid of schema version 1 wrote
        assert migrate_sqlite(conn, up_to=1) == 1
        doc = msgspec.json.encode(agent()).decode()
        conn.execute("INSERT INTO agents (id, provider, state, doc) VALUES (?, ?, ?, ?)", ("agt-1", "prov-a", "ready", doc))
    conn.close()

    store = SqliteStore(str(path))
    await store.open()
    try:
        assert await store.schema_version() == LATEST_VERSION
        assert_same(await store.agents.get("agt-1"), agent())
        await store.rollups.put_many([rollup("GPU-a", 1)])  # the table version 2 added
        assert len(await store.rollups.list("GPU-a")) == 1
    finally:
        await store.close()


async def test_api_keys_written_at_schema_version_2_are_listed_by_account_after_migrating(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    legacy = ApiKeyRecord(key_hash="a" * 64, name="bootstrap operator", role="operator", created_at=NOW)
    by_hand = ApiKeyRecord(key_hash="b" * 64, name="acme ci", role="provider", created_at=NOW, subject="acme")
    with sqlite3.connect(path, isolation_level=None) as conn:
        assert migrate_sqlite(conn, up_to=2) == 2
        for rec in (legacy, by_hand):
            conn.execute("INSERT INTO api_keys (key_hash, doc) VALUES (?, ?)", (rec.key_hash, msgspec.json.encode(rec).decode()))
    conn.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        assert_same(await store.api_keys.get("a" * 64), legacy)
        assert_same(await store.api_keys.list(subject="acme"), [by_hand])
        assert await store.accounts.add(account("acme", "provider"))  # the table version 4 added
    finally:
        await store.close()


async def test_a_mongodb_database_at_schema_version_1_is_migrated(mongo_url: str) -> None:
    store = MongoStore(mongo_url)
    async with raw_client(mongo_url) as client:
        assert await migrate_mongo(client[store.database], up_to=1) == 1
    await store.open()
    try:
        assert await store.schema_version() == LATEST_VERSION
        async with raw_client(mongo_url) as client:
            indexes = await client[store.database].rollups.index_information()
        assert [("gpu_uuid", 1), ("minute", 1)] in [spec["key"] for spec in indexes.values()]  # version 2's index
        await store.rollups.put_many([rollup("GPU-a", 1)])
        assert len(await store.rollups.list("GPU-a")) == 1
    finally:
        await store.close()


async def test_a_store_newer_than_this_code_is_refused(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    await _pretend_schema_version(store, LATEST_VERSION + 1)
    await store.close()
    with pytest.raises(ConfigError, match="newer than this idlegrid"):
        await open_store(store_url).open()


async def _pretend_schema_version(store: Store, version: int) -> None:
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path, isolation_level=None) as conn:
            conn.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', 0)", (version,))
        conn.close()
    else:
        assert isinstance(store, MongoStore)
        async with raw_client(store.url) as client:
            await client[store.database].meta.update_one({"_id": "schema"}, {"$set": {"version": version}})


# --- store URLs -------------------------------------------------------------------------------------


def test_sqlite_urls_name_a_path_after_the_third_slash() -> None:
    relative, absolute = open_store("sqlite:///state/master.db"), open_store("sqlite:////var/lib/idlegrid/master.db")
    assert isinstance(relative, SqliteStore) and relative.path == "state/master.db"
    assert isinstance(absolute, SqliteStore) and absolute.path == "/var/lib/idlegrid/master.db"


def test_mongodb_urls_name_their_database() -> None:
    store = open_store("mongodb://ops:secret@db1:27017,db2:27017/idlegrid?replicaSet=rs0")
    assert isinstance(store, MongoStore) and store.backend == "mongodb" and store.database == "idlegrid"
    assert "secret" not in repr(store)


@pytest.mark.parametrize(
    "url", ["", "postgres://db/idlegrid", "sqlite://master.db", "sqlite:///", "mongodb://db:27017", "mongodb://db/a.b"]
)
def test_other_store_urls_are_refused_with_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        open_store(url)


async def test_a_file_that_is_not_an_sqlite_database_is_refused_with_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "master.db"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(ConfigError, match="cannot open the SQLite store"):
        await open_store(f"sqlite:///{path}").open()


async def test_an_unreachable_mongodb_is_refused_with_a_config_error() -> None:
    url = f"mongodb://127.0.0.1:{free_port()}/idlegrid?serverSelectionTimeoutMS=300"
    with pytest.raises(ConfigError, match="cannot open the MongoDB store"):
        await open_store(url).open()


async def test_an_in_memory_sqlite_store_works() -> None:
    store = open_store("sqlite:///:memory:")
    await store.open()
    try:
        await store.agents.put(agent())
        assert await store.agents.list() == [agent()]
    finally:
        await store.close()


async def test_an_unopened_store_says_so(store_url: str) -> None:
    with pytest.raises(RuntimeError, match="not open"):
        await open_store(store_url).agents.get("agt-1")


# --- GPU faults and container exits (master/faults.py) -----------------------------------------------


async def test_a_gpus_fault_and_accepted_ecc_count_and_an_agents_exited_containers_round_trip(store: Store) -> None:
    fault = GpuFault(kind="xid", reason="Xid 79: fallen off the bus", since=NOW, code=79)
    rec = gpu("GPU-a", state="faulty", fault=fault, ecc_acknowledged=3)
    await store.gpus.put_many([rec])
    assert_same(await store.gpus.get("GPU-a"), rec)
    assert [g.fault for g in await store.gpus.list(state="faulty")] == [fault]
    ended = agent(exited={"job-1": 3, "job-2": 137})
    await store.agents.put(ended)
    assert_same(await store.agents.get("agt-1"), ended)
    healthy = gpu("GPU-a")  # a repair clears the fault: the stored record has none
    await store.gpus.put_many([healthy])
    stored = await store.gpus.get("GPU-a")
    assert stored is not None and stored.fault is None


# --- workloads ------------------------------------------------------------------------------------


def workload(workload_id: str = "wl-1", account: str = "alice", created_at: float = NOW, **overrides: Any) -> WorkloadRecord:
    spec = WorkloadSpec(
        name="train",
        image="ghcr.io/acme/train:1",
        command=["python", "train.py"],
        env={"HF_TOKEN": "secret"},
        ports=[8080, 9090],
        replicas=2,
        replica=ReplicaSpec(gpus=2, models=["h100-sxm"], cpu_cores=8.5, mig_profile=None),
        constraints=PlacementConstraints(regions=["eu-west"], min_reputation=0.75, nvlink=True),
        max_duration_s=3600.5,
        labels={"team": "ml"},
    )
    fields: dict[str, Any] = dict(
        id=workload_id,
        account=account,
        spec=spec,
        state="queued",
        state_reason="submitted",
        created_at=created_at,
        queued_at=created_at,
        version=1,
    )
    return WorkloadRecord(**(fields | overrides))


async def test_workload_round_trips_its_spec_and_assignments(store: Store) -> None:
    placed = workload(
        state="running",
        assignments=[
            Assignment(replica=0, agent_id="agt-1", units=["GPU-a", "GPU-b"], container="wl-1-r0-a1", command_id="cmd-1")
        ],
        exit_codes=[0, 137],
        started_at=NOW + 5.5,
    )
    await store.workloads.insert(placed)
    assert_same(await store.workloads.get("wl-1"), placed)
    assert await store.workloads.get("wl-nope") is None


async def test_a_workload_id_is_inserted_once(store: Store) -> None:
    await store.workloads.insert(workload())
    with pytest.raises(DuplicateWorkload):
        await store.workloads.insert(workload(state="running"))
    assert (await store.workloads.get("wl-1")).state == "queued"  # type: ignore[union-attr]


async def test_a_workload_update_needs_the_version_it_read(store: Store) -> None:
    await store.workloads.insert(workload())
    await store.workloads.update(workload(state="scheduled", version=2), expected_version=1)
    with pytest.raises(StaleWorkload):  # a writer that read version 1 too comes second
        await store.workloads.update(workload(state="cancelled", version=2), expected_version=1)
    assert_same(await store.workloads.get("wl-1"), workload(state="scheduled", version=2))
    with pytest.raises(StaleWorkload):
        await store.workloads.update(workload("wl-never", version=2), expected_version=1)


async def test_of_concurrent_workload_writers_on_separate_connections_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]
    await stores[0].workloads.insert(workload())

    async def write(store: Store, state: str) -> bool:
        try:
            await store.workloads.update(workload(state=state, version=2), expected_version=1)
        except StaleWorkload:
            return False
        return True

    states = ["scheduled", "cancelled", "failed", "running"]
    won = await asyncio.gather(*(write(s, state) for s, state in zip(stores, states, strict=True)))
    assert sum(won) == 1
    assert (await stores[0].workloads.get("wl-1")).state == states[won.index(True)]  # type: ignore[union-attr]


async def test_workloads_list_newest_first_filtered_and_paged(store: Store) -> None:
    recs = [
        workload("wl-a", "alice", NOW + 1),
        workload("wl-b", "bob", NOW + 2, state="running"),
        workload("wl-c", "alice", NOW + 3, state="cancelled"),
        workload("wl-d", "alice", NOW + 3),  # same instant as wl-c: the id breaks the tie
    ]
    for rec in recs:
        await store.workloads.insert(rec)
    ids = lambda found: [w.id for w in found]  # noqa: E731
    assert ids(await store.workloads.list()) == ["wl-d", "wl-c", "wl-b", "wl-a"]
    assert ids(await store.workloads.list(account="alice")) == ["wl-d", "wl-c", "wl-a"]
    assert ids(await store.workloads.list(states=["queued", "running"])) == ["wl-d", "wl-b", "wl-a"]
    assert ids(await store.workloads.list(account="alice", states=["queued"])) == ["wl-d", "wl-a"]
    assert await store.workloads.list(states=[]) == []
    first = await store.workloads.list(limit=2)
    assert ids(first) == ["wl-d", "wl-c"]
    rest = await store.workloads.list(before=workload_order(first[-1].created_at, first[-1].id), limit=2)
    assert ids(rest) == ["wl-b", "wl-a"]


async def test_a_workload_holding_a_nan_is_refused_before_it_is_written(store: Store) -> None:
    with pytest.raises(UnstorableRecord, match="created_at"):
        await store.workloads.insert(workload(created_at=float("nan")))
    assert await store.workloads.list() == []


# --- fair-share usage (management/scheduler/usage_saving.py) ---------------------------------------------


def figure(account: str, project: str | None = None, gpu_seconds: float = 3600.0, decayed_to: float = NOW) -> FairShareUsage:
    return FairShareUsage(account=account, project=project, gpu_seconds=gpu_seconds, decayed_to=decayed_to)


async def test_fair_share_figures_round_trip_by_account_its_own_first_then_by_project(store: Store) -> None:
    assert await store.fair_share.list() == []
    written = [
        figure("bob", "vision", 7.5),
        figure("alice-2"),
        figure("alice", "nlp", 0.25),
        figure("bob", None, 12.0),
        figure("alice"),
    ]
    await store.fair_share.put_many(written)
    assert_same(
        await store.fair_share.list(),
        [
            figure("alice"),
            figure("alice", "nlp", 0.25),
            figure("alice-2"),
            figure("bob", None, 12.0),
            figure("bob", "vision", 7.5),
        ],
    )


async def test_putting_fair_share_figures_replaces_those_of_the_same_account_and_project_only(store: Store) -> None:
    await store.fair_share.put_many([figure("alice", None, 100.0), figure("alice", "nlp", 60.0), figure("bob", None, 5.0)])
    later = NOW + 60
    await store.fair_share.put_many([figure("alice", None, 99.0, later), figure("alice", "nlp", 59.5, later)])
    assert_same(
        await store.fair_share.list(),
        [figure("alice", None, 99.0, later), figure("alice", "nlp", 59.5, later), figure("bob", None, 5.0)],
    )


async def test_a_fair_share_batch_holding_a_nan_writes_nothing(store: Store) -> None:
    with pytest.raises(UnstorableRecord, match="gpu_seconds"):
        await store.fair_share.put_many([figure("alice"), figure("bob", None, float("nan"))])
    assert await store.fair_share.list() == []


async def test_fair_share_figures_outlive_the_store_connection(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await first.fair_share.put_many([figure("alice"), figure("alice", "default", 1800.0)])
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await second.fair_share.list(), [figure("alice"), figure("alice", "default", 1800.0)])
    finally:
        await second.close()
