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
from management.store import (
    LEDGER,
    PRICES,
    RENTALS,
    alert_rule_repo,
    fair_share_repo,
    ledger_repo,
    output_repo,
    price_repo,
    rental_repo,
    silence_repo,
    webhook_repo,
    workload_repo,
)
from management.store.ledger import UnbalancedEntry
from management.store.outputs import output_key
from management.store.rentals import StaleRental, rental_order
from management.store.workloads import DuplicateWorkload, StaleWorkload, workload_order
from master.records import (
    AccountRecord,
    AgentRecord,
    AlertRuleRecord,
    ApiKeyRecord,
    Assignment,
    CommandRecord,
    EventRecord,
    FairShareUsage,
    GpuFault,
    GpuRecord,
    HostRollup,
    KeptOutput,
    LedgerEntry,
    LedgerLine,
    PlacementConstraints,
    PriceChange,
    PriceRecord,
    RentalHost,
    RentalRecord,
    ReplicaSpec,
    RevocationRecord,
    SilenceRecord,
    TelemetryRollup,
    TokenRecord,
    WebhookRecord,
    WorkloadRecord,
    WorkloadSpec,
)
from master.store import MongoStore, SqliteStore, open_store
from master.store.base import Store, TokenOutcome
from master.store.errors import UnstorableRecord
from master.store.migrations import LATEST_VERSION, MONGO_MIGRATIONS, migrate_mongo, migrate_sqlite
from tests.master.conftest import OpenStore
from tests.support.grid import free_port
from tests.support.poison import poison

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
        nvlinks=(NvLink(link=0, active=True, remote_pci_bus_id="00000000:1b:00.0"), NvLink(link=1, active=False)),
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
        flags=("nvlink_partial",),
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
    moved = gpu("GPU-a", state="faulty", tier=None, flags=(), info=gpu_info("GPU-a", simulated=False, nvlinks=()))
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


async def test_an_account_keeps_its_password_hash_and_epoch_and_starts_with_none(store: Store) -> None:
    assert await store.accounts.add(account("rita"))
    fresh = await store.accounts.get("rita")
    assert fresh is not None and (fresh.password_hash, fresh.password_epoch) == ("", 0)
    with_password = account("rita", password_hash="$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2g", password_epoch=3)
    await store.accounts.put(with_password)
    assert_same(await store.accounts.get("rita"), with_password)
    assert [(a.password_hash, a.password_epoch) for a in await store.accounts.list(role="renter")] == [
        (with_password.password_hash, 3)
    ]


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


async def test_a_rollup_round_trips_the_history_fields(store: Store) -> None:
    full = rollup(
        "GPU-a",
        120,
        minutes=60,
        memory_used_mib_avg=20_480.5,
        temperature_avg=64.25,
        power_max_w=690.0,
        clock_sm_avg_mhz=1755.5,
        clock_mem_avg_mhz=2619.0,
        ecc_corrected=4,
        xid_count=1,
        throttle_reasons=["hw_slowdown", "sw_thermal"],
    )
    await store.hourly_rollups.put_many([full])
    assert_same(await store.hourly_rollups.list("GPU-a"), [full])


async def test_hourly_rollups_are_kept_apart_from_the_minutes(store: Store) -> None:
    await store.rollups.put_many([rollup("GPU-a", 60), rollup("GPU-a", 61)])
    hour = rollup("GPU-a", 60, minutes=2, samples=12)
    await store.hourly_rollups.put_many([hour])
    assert [r.minute for r in await store.rollups.list("GPU-a")] == [60, 61]
    assert_same(await store.hourly_rollups.list("GPU-a", since_minute=60, until_minute=120), [hour])
    assert await store.hourly_rollups.list("GPU-a", since_minute=61) == []


async def test_retention_deletes_only_the_named_gpus_rollups_before_the_minute(store: Store) -> None:
    await store.rollups.put_many([rollup(g, m) for g in ("GPU-a", "GPU-b", "GPU-c") for m in (10, 11, 12)])
    await store.hourly_rollups.put_many([rollup("GPU-a", 0, minutes=60)])

    assert await store.rollups.delete_before(["GPU-a", "GPU-b", "GPU-unknown"], 12) == 4
    assert [r.minute for r in await store.rollups.list("GPU-a")] == [12]
    assert [r.minute for r in await store.rollups.list("GPU-b")] == [12]
    assert [r.minute for r in await store.rollups.list("GPU-c")] == [10, 11, 12]
    assert len(await store.hourly_rollups.list("GPU-a")) == 1  # the minutes' retention leaves the hours alone
    assert await store.rollups.delete_before([], 100) == 0
    assert await store.hourly_rollups.delete_before(["GPU-a"], 60) == 1
    assert await store.hourly_rollups.list("GPU-a") == []


async def test_a_large_rollup_batch_is_written_whole(store: Store) -> None:
    batch = [rollup(f"GPU-{g}", m) for g in range(20) for m in range(50)]
    await store.rollups.put_many(batch)
    assert [r.minute for r in await store.rollups.list("GPU-7")] == list(range(50))


# --- a host's own telemetry rollups (host history) ----------------------------------------------------


def host_rollup(agent_id: str, minute: int, samples: int = 6, **overrides: Any) -> HostRollup:
    fields: dict[str, Any] = dict(
        agent_id=agent_id,
        minute=minute,
        samples=samples,
        cpu_pct_avg=37.25,
        cpu_pct_max=99.5,
        load_1m_avg=3.5,
        ram_used_mib_avg=123_456.75,
        ram_used_mib_max=200_000,
        ram_total_mib=515_000,
        disk_used_gib=1677.25,
        disk_free_gib_min=2048.0,
        net_rx_bytes=9_000_000_000_000,  # beyond 32 bits: a busy hour of a 100 Gbit/s link
        net_tx_bytes=0,
    )
    return HostRollup(**(fields | overrides))


async def test_host_rollups_round_trip_every_field_and_upsert_by_host_and_minute(store: Store) -> None:
    await store.host_rollups.put_many([host_rollup("agt-1", 100), host_rollup("agt-1", 101), host_rollup("agt-2", 100)])
    blank = HostRollup(agent_id="agt-1", minute=101, samples=2)  # a host that said nothing of itself
    await store.host_rollups.put_many([blank])
    assert_same(await store.host_rollups.list("agt-1"), [host_rollup("agt-1", 100), blank])
    assert_same(await store.host_rollups.list("agt-2"), [host_rollup("agt-2", 100)])


async def test_host_rollups_range_is_since_inclusive_until_exclusive(store: Store) -> None:
    await store.host_rollups.put_many([host_rollup("agt-1", m) for m in [13, 10, 12, 11]] + [host_rollup("agt-2", 11)])
    assert [r.minute for r in await store.host_rollups.list("agt-1")] == [10, 11, 12, 13]
    assert [r.minute for r in await store.host_rollups.list("agt-1", since_minute=11, until_minute=13)] == [11, 12]
    assert [r.minute for r in await store.host_rollups.list("agt-1", until_minute=11)] == [10]
    assert await store.host_rollups.list("agt-3") == []


async def test_host_rollups_are_kept_apart_from_the_hours_and_from_the_gpus(store: Store) -> None:
    await store.host_rollups.put_many([host_rollup("agt-1", 60), host_rollup("agt-1", 61)])
    hour = host_rollup("agt-1", 60, minutes=2, samples=12)
    await store.host_hourly_rollups.put_many([hour])
    await store.rollups.put_many([rollup("agt-1", 60)])  # a GPU rollup whose uuid is the host's id: another key space
    assert [r.minute for r in await store.host_rollups.list("agt-1")] == [60, 61]
    assert_same(await store.host_hourly_rollups.list("agt-1"), [hour])
    assert [r.samples for r in await store.rollups.list("agt-1")] == [6]


async def test_host_retention_deletes_only_the_named_hosts_rollups_before_the_minute(store: Store) -> None:
    await store.host_rollups.put_many([host_rollup(a, m) for a in ("agt-1", "agt-2", "agt-3") for m in (10, 11, 12)])
    await store.host_hourly_rollups.put_many([host_rollup("agt-1", 0, minutes=60)])

    assert await store.host_rollups.delete_before(["agt-1", "agt-2", "agt-unknown"], 12) == 4
    assert [r.minute for r in await store.host_rollups.list("agt-1")] == [12]
    assert [r.minute for r in await store.host_rollups.list("agt-3")] == [10, 11, 12]
    assert len(await store.host_hourly_rollups.list("agt-1")) == 1
    assert await store.host_rollups.delete_before([], 100) == 0
    assert await store.host_hourly_rollups.delete_before(["agt-1"], 60) == 1
    assert await store.host_hourly_rollups.list("agt-1") == []


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


async def test_stores_at_schema_version_8_gain_the_host_rollups_by_migrating(tmp_path: Path, mongo_url: str) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path, isolation_level=None) as conn:
        assert migrate_sqlite(conn, up_to=8) == 8
    conn.close()
    mongo = MongoStore(mongo_url)
    async with raw_client(mongo_url) as client:
        assert await migrate_mongo(client[mongo.database], up_to=8) == 8
    for store in (SqliteStore(str(path)), mongo):
        await store.open()
        try:
            await store.host_rollups.put_many([host_rollup("agt-1", 1)])  # the tables version 9 added
            await store.host_hourly_rollups.put_many([host_rollup("agt-1", 60)])
            assert [len(await store.host_rollups.list("agt-1")), len(await store.host_hourly_rollups.list("agt-1"))] == [1, 1]
        finally:
            await store.close()
    async with raw_client(mongo_url) as client:
        for name in ("host_rollups", "host_hourly_rollups"):
            indexes = await client[mongo.database][name].index_information()
            assert [("agent_id", 1), ("minute", 1)] in [spec["key"] for spec in indexes.values()]


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
    await workload_repo(store).insert(placed)
    assert_same(await workload_repo(store).get("wl-1"), placed)
    assert await workload_repo(store).get("wl-nope") is None


async def test_a_workload_id_is_inserted_once(store: Store) -> None:
    await workload_repo(store).insert(workload())
    with pytest.raises(DuplicateWorkload):
        await workload_repo(store).insert(workload(state="running"))
    assert (await workload_repo(store).get("wl-1")).state == "queued"  # type: ignore[union-attr]


async def test_a_workload_update_needs_the_version_it_read(store: Store) -> None:
    await workload_repo(store).insert(workload())
    await workload_repo(store).update(workload(state="scheduled", version=2), expected_version=1)
    with pytest.raises(StaleWorkload):  # a writer that read version 1 too comes second
        await workload_repo(store).update(workload(state="cancelled", version=2), expected_version=1)
    assert_same(await workload_repo(store).get("wl-1"), workload(state="scheduled", version=2))
    with pytest.raises(StaleWorkload):
        await workload_repo(store).update(workload("wl-never", version=2), expected_version=1)


async def test_of_concurrent_workload_writers_on_separate_connections_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]
    await workload_repo(stores[0]).insert(workload())

    async def write(store: Store, state: str) -> bool:
        try:
            await workload_repo(store).update(workload(state=state, version=2), expected_version=1)
        except StaleWorkload:
            return False
        return True

    states = ["scheduled", "cancelled", "failed", "running"]
    won = await asyncio.gather(*(write(s, state) for s, state in zip(stores, states, strict=True)))
    assert sum(won) == 1
    assert (await workload_repo(stores[0]).get("wl-1")).state == states[won.index(True)]  # type: ignore[union-attr]


async def test_workloads_list_newest_first_filtered_and_paged(store: Store) -> None:
    recs = [
        workload("wl-a", "alice", NOW + 1),
        workload("wl-b", "bob", NOW + 2, state="running"),
        workload("wl-c", "alice", NOW + 3, state="cancelled"),
        workload("wl-d", "alice", NOW + 3),  # same instant as wl-c: the id breaks the tie
    ]
    for rec in recs:
        await workload_repo(store).insert(rec)
    ids = lambda found: [w.id for w in found]  # noqa: E731
    assert ids(await workload_repo(store).list()) == ["wl-d", "wl-c", "wl-b", "wl-a"]
    assert ids(await workload_repo(store).list(account="alice")) == ["wl-d", "wl-c", "wl-a"]
    assert ids(await workload_repo(store).list(states=["queued", "running"])) == ["wl-d", "wl-b", "wl-a"]
    assert ids(await workload_repo(store).list(account="alice", states=["queued"])) == ["wl-d", "wl-a"]
    assert await workload_repo(store).list(states=[]) == []
    first = await workload_repo(store).list(limit=2)
    assert ids(first) == ["wl-d", "wl-c"]
    rest = await workload_repo(store).list(before=workload_order(first[-1].created_at, first[-1].id), limit=2)
    assert ids(rest) == ["wl-b", "wl-a"]


async def test_a_workload_holding_a_nan_is_refused_before_it_is_written(store: Store) -> None:
    with pytest.raises(UnstorableRecord, match="created_at"):
        await workload_repo(store).insert(workload(created_at=float("nan")))
    assert await workload_repo(store).list() == []


# --- workload containers' kept output (management/services/outputs.py) ---------------------------------------------------


def _output(workload: str = "wl-1", replica: int = 0, attempt: int = 1, **fields: Any) -> KeptOutput:
    defaults: dict[str, Any] = {"account": "acct-r", "agent_id": "agent-1", "ended_at": 100.0}
    return KeptOutput(
        id=output_key(workload, replica, attempt),
        workload_id=workload,
        replica=replica,
        attempt=attempt,
        container=f"{workload}-r{replica}-a{attempt}",
        **(defaults | fields),
    )


async def test_kept_output_round_trips_bytes_that_are_not_utf8(store: Store) -> None:
    data = b"line one\n\xff\xfe binary \x00 tail\n" * 1000
    rec = _output(state="kept", data=data, truncated=True, exit_code=3, collected_at=101.5)
    await output_repo(store).put(rec)
    assert await output_repo(store).get(rec.id) == rec
    assert await output_repo(store).get(output_key("wl-1", 0, 2)) is None


async def test_putting_a_kept_output_again_replaces_it(store: Store) -> None:
    await output_repo(store).put(_output())
    await output_repo(store).put(_output(state="lost", reason="the host kept none"))
    got = await output_repo(store).get(output_key("wl-1", 0, 1))
    assert got is not None and (got.state, got.reason) == ("lost", "the host kept none")


async def test_kept_outputs_list_by_workload_oldest_end_first(store: Store) -> None:
    for replica, attempt, ended in ((1, 1, 30.0), (0, 2, 20.0), (0, 1, 10.0)):
        await output_repo(store).put(_output(replica=replica, attempt=attempt, ended_at=ended))
    await output_repo(store).put(_output(workload="wl-2"))
    listed = await output_repo(store).list(workload_id="wl-1")
    assert [(r.replica, r.attempt) for r in listed] == [(0, 1), (0, 2), (1, 1)]
    assert await output_repo(store).list(workload_id="wl-none") == []
    assert len(await output_repo(store).list()) == 4 and await output_repo(store).list(limit=0) == []


async def test_pending_outputs_are_listed_oldest_first_up_to_the_limit(store: Store) -> None:
    await output_repo(store).put(_output(workload="wl-b", ended_at=20.0))
    await output_repo(store).put(_output(workload="wl-a", ended_at=10.0))
    await output_repo(store).put(_output(workload="wl-c", ended_at=5.0, state="kept"))
    assert [r.workload_id for r in await output_repo(store).list(state="pending")] == ["wl-a", "wl-b"]
    assert [r.workload_id for r in await output_repo(store).list(state="pending", limit=1)] == ["wl-a"]
    assert [r.workload_id for r in await output_repo(store).list(workload_id="wl-c", state="pending")] == []


async def test_retention_deletes_old_settled_outputs_and_never_a_pending_one(store: Store) -> None:
    await output_repo(store).put(_output(workload="wl-old", ended_at=10.0, state="kept"))
    await output_repo(store).put(_output(workload="wl-lost", ended_at=10.0, state="lost"))
    await output_repo(store).put(_output(workload="wl-wait", ended_at=10.0))  # pending: its host still holds it
    await output_repo(store).put(_output(workload="wl-new", ended_at=50.0, state="kept"))
    assert await output_repo(store).delete_before(20.0) == 2
    left = {
        r.workload_id for w in ("wl-old", "wl-lost", "wl-wait", "wl-new") for r in await output_repo(store).list(workload_id=w)
    }
    assert left == {"wl-wait", "wl-new"}


# --- fair-share usage (management/scheduler/usage_saving.py) ---------------------------------------------


def figure(account: str, project: str | None = None, gpu_seconds: float = 3600.0, decayed_to: float = NOW) -> FairShareUsage:
    return FairShareUsage(account=account, project=project, gpu_seconds=gpu_seconds, decayed_to=decayed_to)


async def test_fair_share_figures_round_trip_by_account_its_own_first_then_by_project(store: Store) -> None:
    assert await fair_share_repo(store).list() == []
    written = [
        figure("bob", "vision", 7.5),
        figure("alice-2"),
        figure("alice", "nlp", 0.25),
        figure("bob", None, 12.0),
        figure("alice"),
    ]
    await fair_share_repo(store).put_many(written)
    assert_same(
        await fair_share_repo(store).list(),
        [
            figure("alice"),
            figure("alice", "nlp", 0.25),
            figure("alice-2"),
            figure("bob", None, 12.0),
            figure("bob", "vision", 7.5),
        ],
    )


async def test_putting_fair_share_figures_replaces_those_of_the_same_account_and_project_only(store: Store) -> None:
    await fair_share_repo(store).put_many([figure("alice", None, 100.0), figure("alice", "nlp", 60.0), figure("bob", None, 5.0)])
    later = NOW + 60
    await fair_share_repo(store).put_many([figure("alice", None, 99.0, later), figure("alice", "nlp", 59.5, later)])
    assert_same(
        await fair_share_repo(store).list(),
        [figure("alice", None, 99.0, later), figure("alice", "nlp", 59.5, later), figure("bob", None, 5.0)],
    )


async def test_a_fair_share_batch_holding_a_nan_writes_nothing(store: Store) -> None:
    with pytest.raises(UnstorableRecord, match="gpu_seconds"):
        await fair_share_repo(store).put_many([figure("alice"), figure("bob", None, float("nan"))])
    assert await fair_share_repo(store).list() == []


async def test_fair_share_figures_outlive_the_store_connection(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await fair_share_repo(first).put_many([figure("alice"), figure("alice", "default", 1800.0)])
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await fair_share_repo(second).list(), [figure("alice"), figure("alice", "default", 1800.0)])
    finally:
        await second.close()


# --- the market: prices ------------------------------------------------------------------------------


def price(provider: str = "acme", agent_id: str = "", on_demand: int = 2_500_000, **overrides: Any) -> PriceRecord:
    fields: dict[str, Any] = dict(
        provider=provider,
        agent_id=agent_id,
        on_demand=on_demand,
        min_bid=800_000,
        reserved_discount=0.25,
        max_duration_s=86_400.0,
        updated_at=NOW,
    )
    return PriceRecord(**(fields | overrides))


async def test_a_price_round_trips_and_put_replaces_the_same_provider_and_host_only(store: Store) -> None:
    await price_repo(store).put(price())
    await price_repo(store).put(price(agent_id="agt-1", min_bid=None, max_duration_s=None))
    await price_repo(store).put(price(on_demand=3_000_000, reserved_discount=0.0))  # the default again: replaces it
    assert_same(
        await price_repo(store).list(),
        [price(on_demand=3_000_000, reserved_discount=0.0), price(agent_id="agt-1", min_bid=None, max_duration_s=None)],
    )


async def test_prices_list_by_provider_then_host_the_providers_default_first(store: Store) -> None:
    for rec in [price("zeta", "agt-2"), price("acme", "agt-9"), price("zeta"), price("acme", "agt-1"), price("acme")]:
        await price_repo(store).put(rec)
    assert [(p.provider, p.agent_id) for p in await price_repo(store).list()] == [
        ("acme", ""),
        ("acme", "agt-1"),
        ("acme", "agt-9"),
        ("zeta", ""),
        ("zeta", "agt-2"),
    ]
    assert [(p.provider, p.agent_id) for p in await price_repo(store).list(provider="zeta")] == [("zeta", ""), ("zeta", "agt-2")]
    assert await price_repo(store).list(provider="nobody") == []


async def test_deleting_a_price_removes_that_record_only_and_says_whether_there_was_one(store: Store) -> None:
    await price_repo(store).put(price())
    await price_repo(store).put(price(agent_id="agt-1"))
    assert await price_repo(store).delete("acme", "agt-1") is True
    assert await price_repo(store).delete("acme", "agt-1") is False
    assert await price_repo(store).delete("other", "") is False
    assert_same(await price_repo(store).list(), [price()])


# --- the market: rentals -----------------------------------------------------------------------------


def rental_host(agent_id: str = "agt-1", provider: str = "acme", gpus: int = 2, price: int = 2_500_000) -> RentalHost:
    return RentalHost(
        agent_id=agent_id, provider=provider, gpus=gpus, price=price, units=[f"{agent_id}/GPU-{i}" for i in range(gpus)]
    )


def rental(
    rental_id: str = "wl-1-a1", started_at: float = NOW, *, hosts: list[RentalHost] | None = None, **overrides: Any
) -> RentalRecord:
    fields: dict[str, Any] = dict(
        id=rental_id,
        workload_id=rental_id.rsplit("-a", 1)[0],
        account="alice",
        kind="interruptible",
        hosts=[rental_host()] if hosts is None else hosts,
        bid_changes=[PriceChange(at=started_at + 60.5, price=1_000_000)],
        started_at=started_at,
        version=1,
    )
    return RentalRecord(**(fields | overrides))


async def test_a_rental_round_trips_its_hosts_and_bid_changes(store: Store) -> None:
    rec = rental(
        hosts=[rental_host(), rental_host("agt-2", "zeta", gpus=1, price=900_000)],
        ended_at=NOW + 120.0,
        end_reason="container exited",
        host_failure="GPU-1 fell off the bus",
        reserved_until=NOW + 3600.0,
        rating=4,
    )
    assert await rental_repo(store).insert(rec) is True
    assert_same(await rental_repo(store).get("wl-1-a1"), rec)
    assert await rental_repo(store).get("wl-never-a1") is None


async def test_a_taken_rental_id_is_refused_and_changes_nothing(store: Store) -> None:
    assert await rental_repo(store).insert(rental()) is True
    assert await rental_repo(store).insert(rental(account="mallory", hosts=[rental_host("agt-9", "evil")])) is False
    assert_same(await rental_repo(store).get("wl-1-a1"), rental())
    assert await rental_repo(store).list(agent_id="agt-9") == []


async def test_of_concurrent_inserts_of_one_rental_id_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]
    accounts = [f"renter-{i}" for i in range(8)]
    won = await asyncio.gather(*(rental_repo(s).insert(rental(account=a)) for s, a in zip(stores * 2, accounts, strict=True)))
    assert sum(won) == 1
    assert (await rental_repo(stores[0]).get("wl-1-a1")).account == accounts[won.index(True)]  # type: ignore[union-attr]


async def test_a_rental_update_needs_the_version_it_read(store: Store) -> None:
    await rental_repo(store).insert(rental())
    await rental_repo(store).update(rental(ended_at=NOW + 60, version=2), expected_version=1)
    with pytest.raises(StaleRental):  # a writer that read version 1 too comes second
        await rental_repo(store).update(rental(rating=1, version=2), expected_version=1)
    assert_same(await rental_repo(store).get("wl-1-a1"), rental(ended_at=NOW + 60, version=2))
    with pytest.raises(StaleRental):  # never stored
        await rental_repo(store).update(rental("wl-never-a1", version=2), expected_version=1)
    assert await rental_repo(store).get("wl-never-a1") is None


async def test_of_concurrent_rental_writers_on_separate_connections_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]
    await rental_repo(stores[0]).insert(rental())

    async def rate(store: Store, rating: int) -> bool:
        try:
            await rental_repo(store).update(rental(rating=rating, version=2), expected_version=1)
        except StaleRental:
            return False
        return True

    won = await asyncio.gather(*(rate(s, r) for s, r in zip(stores, [1, 2, 3, 4], strict=True)))
    assert sum(won) == 1
    assert (await rental_repo(stores[0]).get("wl-1-a1")).rating == won.index(True) + 1  # type: ignore[union-attr]


async def test_rentals_filter_by_renter_workload_host_provider_and_end(store: Store) -> None:
    both = [rental_host("agt-1", "acme"), rental_host("agt-2", "zeta")]
    recs = [
        rental("wl-1-a1", NOW + 1, hosts=both, ended_at=NOW + 50),
        rental("wl-1-a2", NOW + 2, hosts=[rental_host("agt-2", "zeta")]),
        rental("wl-2-a1", NOW + 3, account="bob", hosts=[rental_host("agt-3", "acme")], ended_at=NOW + 100),
        rental("wl-3-a1", NOW + 4, account="bob", hosts=[rental_host("agt-1", "acme")]),
    ]
    for rec in reversed(recs):
        assert await rental_repo(store).insert(rec)

    async def ids(**filters: Any) -> list[str]:
        return [r.id for r in await rental_repo(store).list(**filters)]

    assert await ids() == ["wl-1-a1", "wl-1-a2", "wl-2-a1", "wl-3-a1"]
    assert await ids(account="bob") == ["wl-2-a1", "wl-3-a1"]
    assert await ids(workload_id="wl-1") == ["wl-1-a1", "wl-1-a2"]
    assert await ids(agent_id="agt-1") == ["wl-1-a1", "wl-3-a1"]  # a rental of two hosts is found by either
    assert await ids(agent_id="agt-2") == ["wl-1-a1", "wl-1-a2"]
    assert await ids(provider="acme") == ["wl-1-a1", "wl-2-a1", "wl-3-a1"]
    assert await ids(provider="zeta", account="alice") == ["wl-1-a1", "wl-1-a2"]
    assert await ids(open_only=True) == ["wl-1-a2", "wl-3-a1"]
    assert await ids(ended_since=NOW + 100) == ["wl-1-a2", "wl-2-a1", "wl-3-a1"]  # open, or ended at or after it
    assert await ids(ended_since=NOW + 100.5) == ["wl-1-a2", "wl-3-a1"]
    assert await ids(ended_since=NOW, agent_id="agt-1") == ["wl-1-a1", "wl-3-a1"]
    assert await ids(open_only=True, provider="acme") == ["wl-3-a1"]
    assert await ids(agent_id="agt-nowhere") == []


async def test_a_rental_with_two_units_on_one_host_is_listed_once_for_it(store: Store) -> None:
    rec = rental(hosts=[rental_host("agt-1", gpus=1), rental_host("agt-1", gpus=1, price=2_000_000)])
    await rental_repo(store).insert(rec)
    assert_same(await rental_repo(store).list(agent_id="agt-1"), [rec])
    assert_same(await rental_repo(store).list(provider="acme"), [rec])


async def test_rentals_list_by_start_then_id_and_page_strictly_after_a_cursor(store: Store) -> None:
    recs = [rental("wl-b-a1", NOW + 5), rental("wl-a-a1", NOW + 5), rental("wl-c-a1", NOW + 1), rental("wl-d-a1", NOW + 9)]
    for rec in recs:
        await rental_repo(store).insert(rec)
    everything = [r.id for r in await rental_repo(store).list()]
    assert everything == ["wl-c-a1", "wl-a-a1", "wl-b-a1", "wl-d-a1"]  # by start, a tie by id
    page = await rental_repo(store).list(limit=2)
    assert [r.id for r in page] == everything[:2]
    last = page[-1]
    rest = await rental_repo(store).list(after=rental_order(last.started_at, last.id), limit=10)
    assert [r.id for r in rest] == everything[2:]
    assert await rental_repo(store).list(limit=0) == []


async def test_updating_a_rental_moves_it_between_host_and_end_filters(store: Store) -> None:
    await rental_repo(store).insert(rental())
    moved = rental(hosts=[rental_host("agt-7", "zeta")], ended_at=NOW + 30, version=2)
    await rental_repo(store).update(moved, expected_version=1)
    assert await rental_repo(store).list(agent_id="agt-1") == []
    assert await rental_repo(store).list(provider="acme") == []
    assert_same(await rental_repo(store).list(agent_id="agt-7", provider="zeta"), [moved])
    assert await rental_repo(store).list(open_only=True) == []
    assert_same(await rental_repo(store).list(ended_since=NOW + 30), [moved])


# --- the market: the ledger --------------------------------------------------------------------------


def entry(key: str, *lines: tuple[str, int], rental: str = "", kind: str = "charge", ts: float = NOW) -> LedgerEntry:
    return LedgerEntry(
        key=key,
        ts=ts,
        kind=kind,
        memo=f"{kind} for {key}",
        lines=[
            LedgerLine(account=account, amount=amount, host="agt-1" if rental else "", workload="wl-1" if rental else "")
            for account, amount in lines
        ],
        rental=rental,
    )


CREDIT = entry("credit:alice:1", ("external", -10_000_000), ("renter:alice", 10_000_000), kind="credit")
HOLD = entry("hold:wl-1-a1:1", ("renter:alice", -3_000_000), ("hold:alice", 3_000_000), rental="wl-1-a1", kind="hold")
CHARGE = entry(
    "charge:wl-1-a1:1",
    ("hold:alice", -2_500_000),
    ("provider:acme", 2_250_000),
    ("platform:fees", 250_000),
    rental="wl-1-a1",
)


def numbered(rec: LedgerEntry, seq: int) -> LedgerEntry:
    return msgspec.structs.replace(rec, seq=seq)


async def test_a_posted_entry_round_trips_with_the_seq_it_was_given(store: Store) -> None:
    first = await ledger_repo(store).post(CREDIT)
    second = await ledger_repo(store).post(HOLD)
    assert first is not None and second is not None and second > first
    assert_same(await ledger_repo(store).get(CREDIT.key), numbered(CREDIT, first))
    assert_same(await ledger_repo(store).get(HOLD.key), numbered(HOLD, second))
    assert await ledger_repo(store).get("charge:never:1") is None


async def test_the_store_assigns_the_seq_whatever_the_caller_set(store: Store) -> None:
    first = await ledger_repo(store).post(numbered(CREDIT, 1_000))
    second = await ledger_repo(store).post(numbered(HOLD, 1))
    assert first is not None and second is not None and second > first
    assert [e.seq for e in await ledger_repo(store).list()] == [first, second]


async def test_posting_an_entry_again_by_its_key_writes_nothing(store: Store) -> None:
    seq = await ledger_repo(store).post(CREDIT)
    assert seq is not None
    again = entry(CREDIT.key, ("external", -99), ("renter:alice", 99), kind="credit")  # same key, other amounts
    assert await ledger_repo(store).post(again) is None
    assert await ledger_repo(store).post(CREDIT) is None
    assert await ledger_repo(store).balances() == {"external": -10_000_000, "renter:alice": 10_000_000}
    assert_same(await ledger_repo(store).list(), [numbered(CREDIT, seq)])
    later = await ledger_repo(store).post(HOLD)
    assert later is not None and later > seq


async def test_of_concurrent_posts_of_one_key_exactly_one_gets_a_seq(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]  # as four Master processes would race after a restart
    seqs = await asyncio.gather(*(ledger_repo(s).post(CHARGE) for s in stores * 4))
    assigned = [seq for seq in seqs if seq is not None]
    assert len(assigned) == 1
    assert_same(await ledger_repo(stores[0]).list(), [numbered(CHARGE, assigned[0])])
    assert await ledger_repo(stores[0]).balances() == {
        "hold:alice": -2_500_000,
        "provider:acme": 2_250_000,
        "platform:fees": 250_000,
    }


@pytest.mark.parametrize(
    "lines",
    [
        [("renter:alice", -3_000_000), ("hold:alice", 2_999_999)],
        [("external", 5)],
        [],
    ],
    ids=["off-by-one", "one-sided", "no-lines"],
)
async def test_an_unbalanced_or_empty_entry_is_refused_whole(store: Store, lines: list[tuple[str, int]]) -> None:
    await ledger_repo(store).post(CREDIT)
    with pytest.raises(UnbalancedEntry, match="hold:wl-1-a1:1"):
        await ledger_repo(store).post(entry("hold:wl-1-a1:1", *lines, rental="wl-1-a1"))
    assert await ledger_repo(store).get("hold:wl-1-a1:1") is None
    assert await ledger_repo(store).balances() == {"external": -10_000_000, "renter:alice": 10_000_000}
    assert await ledger_repo(store).post(HOLD) is not None  # the key was not taken by the refused entry


async def test_an_entry_holding_a_nan_is_refused_and_nothing_is_written(store: Store) -> None:
    with pytest.raises(UnstorableRecord, match="ts"):
        await ledger_repo(store).post(entry("credit:alice:nan", ("external", -1), ("renter:alice", 1), ts=float("nan")))
    assert await ledger_repo(store).list() == []
    assert await ledger_repo(store).balances() == {}


async def test_ledger_lists_by_account_and_rental_paged_by_after_seq(store: Store) -> None:
    other = entry("hold:wl-2-a1:1", ("renter:alice", -1_000_000), ("hold:alice", 1_000_000), rental="wl-2-a1", kind="hold")
    seqs = [await ledger_repo(store).post(rec) for rec in (CREDIT, HOLD, CHARGE, other)]
    posted = [numbered(rec, seq) for rec, seq in zip((CREDIT, HOLD, CHARGE, other), seqs, strict=True) if seq is not None]
    assert len(posted) == 4

    assert_same(await ledger_repo(store).list(), posted)
    assert_same(await ledger_repo(store).list(account="renter:alice"), [posted[0], posted[1], posted[3]])
    assert_same(await ledger_repo(store).list(account="provider:acme"), [posted[2]])
    assert_same(await ledger_repo(store).list(rental="wl-1-a1"), [posted[1], posted[2]])
    assert_same(await ledger_repo(store).list(account="hold:alice", rental="wl-2-a1"), [posted[3]])
    assert await ledger_repo(store).list(account="provider:nobody") == []

    page = await ledger_repo(store).list(account="hold:alice", limit=2)
    assert_same(page, [posted[1], posted[2]])
    assert_same(await ledger_repo(store).list(account="hold:alice", after_seq=page[-1].seq, limit=2), [posted[3]])
    assert await ledger_repo(store).list(after_seq=posted[-1].seq) == []
    assert await ledger_repo(store).list(limit=0) == []


async def test_balances_are_the_sum_of_every_ledger_accounts_lines(store: Store) -> None:
    assert await ledger_repo(store).balances() == {}
    release = entry("release:wl-1-a1", ("hold:alice", -500_000), ("renter:alice", 500_000), rental="wl-1-a1", kind="release")
    for rec in (CREDIT, HOLD, CHARGE, release):
        await ledger_repo(store).post(rec)
    balances = await ledger_repo(store).balances()
    assert balances == {
        "external": -10_000_000,
        "renter:alice": 7_500_000,
        "hold:alice": 0,  # an account whose lines cancel out is still there, at zero
        "provider:acme": 2_250_000,
        "platform:fees": 250_000,
    }
    assert sum(balances.values()) == 0


async def test_ledger_seqs_continue_after_reopening_the_store(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    seq = await ledger_repo(first).post(CREDIT)
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert await ledger_repo(second).post(CREDIT) is None  # still there: not posted twice across a restart
        later = await ledger_repo(second).post(HOLD)
        assert seq is not None and later is not None and later > seq
    finally:
        await second.close()


# --- the market: undecodable records and the migration to schema version 6 -----------------------------


async def test_undecodable_prices_rentals_and_entries_are_skipped_and_reported(store: Store) -> None:
    await price_repo(store).put(price())
    await poison(store, PRICES.name, "acme/agt-poisoned")
    await rental_repo(store).insert(rental("wl-1-a1", NOW + 1))
    await poison(store, RENTALS.name, "wl-0-a1")
    first = await ledger_repo(store).post(CREDIT)
    await poison(store, LEDGER.name, "charge:poisoned:1")
    second = await ledger_repo(store).post(HOLD)
    assert first is not None and second is not None

    assert_same(await price_repo(store).list(), [price()])
    assert_same(await rental_repo(store).list(limit=1), [rental("wl-1-a1", NOW + 1)])  # a page is topped up past it
    assert await rental_repo(store).get("wl-0-a1") is None
    assert_same(await ledger_repo(store).list(limit=2), [numbered(CREDIT, first), numbered(HOLD, second)])
    assert await ledger_repo(store).get("charge:poisoned:1") is None
    assert await ledger_repo(store).balances() == {"external": -10_000_000, "renter:alice": 7_000_000, "hold:alice": 3_000_000}
    assert sorted((q.aggregate, q.key) for q in store.quarantine.records) == [
        ("ledger", "charge:poisoned:1"),
        ("prices", "acme/agt-poisoned"),
        ("rentals", "wl-0-a1"),
    ]


async def test_an_sqlite_file_at_schema_version_5_is_migrated_to_the_market_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = workload()
    with sqlite3.connect(path, isolation_level=None) as conn:  # what an idlegrid of schema version 5 wrote
        assert migrate_sqlite(conn, up_to=5) == 5
        row = (
            old.id,
            old.account,
            old.state,
            workload_order(old.created_at, old.id),
            old.version,
            msgspec.json.encode(old).decode(),
        )
        conn.execute("INSERT INTO workloads (id, account, state, listed, version, doc) VALUES (?, ?, ?, ?, ?, ?)", row)
    conn.close()

    store = SqliteStore(str(path))
    await store.open()
    try:
        assert await store.schema_version() == LATEST_VERSION
        assert_same(await workload_repo(store).get(old.id), old)
        await price_repo(store).put(price())  # the tables version 6 added
        assert await rental_repo(store).insert(rental())
        assert await ledger_repo(store).post(CREDIT) is not None
        assert len(await ledger_repo(store).list(account="renter:alice")) == 1
    finally:
        await store.close()


async def test_a_mongodb_database_at_schema_version_5_gets_the_market_indexes_and_keeps_its_data(mongo_url: str) -> None:
    store = MongoStore(mongo_url)
    old = workload()
    async with raw_client(mongo_url) as client:  # what an idlegrid of schema version 5 wrote
        assert await migrate_mongo(client[store.database], up_to=5) == 5
        doc = msgspec.to_builtins(old) | {"_id": old.id, "listed": workload_order(old.created_at, old.id)}
        await client[store.database].workloads.insert_one(doc)
    await store.open()
    try:
        assert await store.schema_version() == LATEST_VERSION
        assert_same(await workload_repo(store).get(old.id), old)
        async with raw_client(mongo_url) as client:
            ledger_indexes = await client[store.database].ledger.index_information()
            rental_indexes = await client[store.database].rentals.index_information()
        assert [("lines.account", 1), ("seq", 1)] in [spec["key"] for spec in ledger_indexes.values()]
        assert any(spec["key"] == [("seq", 1)] and spec.get("unique") for spec in ledger_indexes.values())
        assert [("host_agents", 1), ("listed", 1)] in [spec["key"] for spec in rental_indexes.values()]
        assert await ledger_repo(store).post(CREDIT) is not None
        assert await rental_repo(store).insert(rental())
    finally:
        await store.close()


# --- alerting: rules put through the API, silences, webhooks (management/monitoring/) ------------------------------


def alert_rule(name: str = "gpu_hot", threshold: float = 85.0) -> AlertRuleRecord:
    spec = {"name": name, "metric": "gpu.temperature_c", "op": ">", "threshold": threshold, "for_s": 120.0}
    return AlertRuleRecord(name=name, spec=spec, updated_at=NOW, updated_by="operator")


async def test_an_alert_rule_round_trips_put_replaces_by_name_and_delete_says_whether_there_was_one(store: Store) -> None:
    await alert_rule_repo(store).put(alert_rule("zz_last"))
    await alert_rule_repo(store).put(alert_rule())
    await alert_rule_repo(store).put(alert_rule(threshold=90.0))  # the same name: replaced
    assert_same(await alert_rule_repo(store).list(), [alert_rule(threshold=90.0), alert_rule("zz_last")])
    assert await alert_rule_repo(store).delete("zz_last") is True
    assert await alert_rule_repo(store).delete("zz_last") is False
    assert_same(await alert_rule_repo(store).list(), [alert_rule(threshold=90.0)])


def silence(silence_id: str, created_at: float, expires_at: float, **overrides: Any) -> SilenceRecord:
    fields: dict[str, Any] = dict(
        id=silence_id,
        created_at=created_at,
        expires_at=expires_at,
        created_by="operator",
        rule="gpu_hot",
        labels={"provider": "acme"},
    )
    return SilenceRecord(**(fields | overrides))


async def test_silences_list_by_creation_and_only_those_still_in_force_at_a_time(store: Store) -> None:
    later = silence("sil-b", NOW + 10, NOW + 100, subject="GPU-1", comment="swapping fans")
    ended = silence("sil-a", NOW, NOW + 50)
    await silence_repo(store).put(later)
    await silence_repo(store).put(ended)
    assert_same(await silence_repo(store).list(), [ended, later])
    assert_same(await silence_repo(store).list(active_at=NOW + 50), [later])  # expiring at that very time: over
    expired_now = msgspec.structs.replace(later, expires_at=NOW + 20)  # expired early: replaced
    await silence_repo(store).put(expired_now)
    assert_same(await silence_repo(store).list(active_at=NOW + 30), [ended])  # the other one ended at NOW + 20
    assert_same(await silence_repo(store).list(), [ended, expired_now])


def webhook(webhook_id: str, owner: str, created_at: float) -> WebhookRecord:
    return WebhookRecord(
        id=webhook_id,
        url=f"https://hooks.example/{webhook_id}",
        secret="s3cret",
        owner=owner,
        role="provider",
        created_at=created_at,
    )


async def test_webhooks_list_by_creation_per_owner_and_delete_says_whether_there_was_one(store: Store) -> None:
    for rec in [webhook("wh-2", "acme", NOW + 1), webhook("wh-1", "zeta", NOW), webhook("wh-3", "acme", NOW + 2)]:
        await webhook_repo(store).put(rec)
    assert [w.id for w in await webhook_repo(store).list()] == ["wh-1", "wh-2", "wh-3"]
    assert_same(
        await webhook_repo(store).list(owner="acme"), [webhook("wh-2", "acme", NOW + 1), webhook("wh-3", "acme", NOW + 2)]
    )
    assert await webhook_repo(store).list(owner="nobody") == []
    assert await webhook_repo(store).delete("wh-2") is True
    assert await webhook_repo(store).delete("wh-2") is False
    assert [w.id for w in await webhook_repo(store).list(owner="acme")] == ["wh-3"]


async def test_an_sqlite_file_at_schema_version_6_is_migrated_to_alerting_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path, isolation_level=None) as conn:
        assert migrate_sqlite(conn, up_to=6) == 6
    conn.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        await price_repo(store).put(price())
    finally:
        await store.close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        assert migrate_sqlite(conn) == LATEST_VERSION >= 7
    conn.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        assert_same(await price_repo(store).list(), [price()])
        await alert_rule_repo(store).put(alert_rule())  # the tables version 7 added
        await webhook_repo(store).put(webhook("wh-1", "acme", NOW))
        assert [r.name for r in await alert_rule_repo(store).list()] == ["gpu_hot"]
    finally:
        await store.close()
