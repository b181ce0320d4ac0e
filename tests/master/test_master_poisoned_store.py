"""The Master starts and serves with an undecodable record in each of its tables, and reports it.

In-process Master on each backend (SQLite file, nx-27017), with the operator API in front of it. The
end-to-end twin, with the Master as a process of its own, is tests/e2e/test_poisoned_store.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from common.errors import EnrollmentError
from common.pki import generate_key, make_csr
from management.app import api_app
from management.endpoints.queue import EndpointRequestRecord
from management.store import (
    AGGREGATES,
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
    billing_repo,
    endpoint_key_repo,
    endpoint_request_repo,
    fair_share_repo,
    ledger_repo,
    output_repo,
    payment_event_repo,
    payout_account_repo,
    price_repo,
    rental_repo,
    workload_repo,
)
from master.config import MasterConfig
from master.enrollment import hash_secret
from master.master import Master
from master.records import (
    FairShareUsage,
    KeptOutput,
    LedgerEntry,
    LedgerLine,
    PriceRecord,
    RentalHost,
    RentalRecord,
    RevocationRecord,
)
from master.store import open_store
from master.store.aggregates import Aggregate
from tests.management.test_api import add_agent
from tests.master.test_store_contract import NOW, agent, command, gpu, host_rollup, rollup, workload
from tests.support.poison import poison

REPORT_TIMEOUT_S = 10.0  # the sweep that reports runs every second or faster
POISONED_API_KEY = "igak_poisoned"
POISONED_TOKEN = "igjt_poisoned"


async def _plant_good_and_bad_records(store_url: str) -> dict[str, str]:
    """One good record and one undecodable one in every table; the keys the bad ones are reported under."""
    store = open_store(store_url)
    await store.open()
    try:
        await store.agents.put(agent("agt-1", state="offline", relay=""))
        await store.gpus.put_many([gpu("GPU-a")])
        await store.commands.put(command("cmd-1", NOW))
        await store.revocations.put(RevocationRecord(serial="0a", agent_id="agt-0", revoked_at=NOW))
        await store.rollups.put_many([rollup("GPU-a", 1)])
        await store.hourly_rollups.put_many([rollup("GPU-a", 60)])
        await store.host_rollups.put_many([host_rollup("agt-1", 1)])
        await store.host_hourly_rollups.put_many([host_rollup("agt-1", 60)])
        await workload_repo(store).insert(workload("wl-1"))
        kept = KeptOutput(
            id="wl-1:r0:a1", workload_id="wl-1", account="alice", replica=0, attempt=1, agent_id="agt-1",
            container="wl-1-r0-a1", state="kept", data=b"done\n", ended_at=NOW,
        )  # fmt: skip
        await output_repo(store).put(kept)
        await fair_share_repo(store).put_many([FairShareUsage(account="alice", gpu_seconds=60.0, decayed_to=NOW)])
        await price_repo(store).put(PriceRecord(provider="acme", on_demand=1_000_000, updated_at=NOW))
        host = RentalHost(agent_id="agt-1", provider="prov", gpus=1, price=1_000_000)
        rental = RentalRecord(
            id="wl-1-a1", workload_id="wl-1", account="alice", kind="on_demand", hosts=[host], started_at=NOW, version=1
        )
        await rental_repo(store).insert(msgspec.structs.replace(rental, ended_at=NOW + 60))
        lines = [LedgerLine(account="external", amount=-5), LedgerLine(account="renter:alice", amount=5)]
        await endpoint_request_repo(store).insert(EndpointRequestRecord(id="req-1", endpoint_id="ep-1", submitted_at=NOW))
        await ledger_repo(store).post(
            LedgerEntry(key="credit:alice:1", ts=NOW, kind="credit", memo="", lines=lines, rental="wl-1-a1")
        )
        return {
            Aggregate.AGENTS: await poison(store, Aggregate.AGENTS, "agt-bad"),
            Aggregate.GPUS: await poison(store, Aggregate.GPUS, "GPU-bad"),
            Aggregate.COMMANDS: await poison(store, Aggregate.COMMANDS, "cmd-bad"),
            Aggregate.TOKENS: await poison(store, Aggregate.TOKENS, hash_secret(POISONED_TOKEN)),
            Aggregate.API_KEYS: await poison(store, Aggregate.API_KEYS, hash_secret(POISONED_API_KEY)),
            Aggregate.EVENTS: await poison(store, Aggregate.EVENTS, "agt-1"),
            Aggregate.REVOCATIONS: await poison(store, Aggregate.REVOCATIONS, "0b"),
            Aggregate.ROLLUPS: await poison(store, Aggregate.ROLLUPS, "GPU-a", minute=2),
            Aggregate.HOURLY_ROLLUPS: await poison(store, Aggregate.HOURLY_ROLLUPS, "GPU-a", minute=120),
            WORKLOADS.name: await poison(store, WORKLOADS.name, "wl-bad"),
            Aggregate.ACCOUNTS: await poison(store, Aggregate.ACCOUNTS, "bad-account"),
            FAIR_SHARE.name: await poison(store, FAIR_SHARE.name, "bad-account/default"),
            PRICES.name: await poison(store, PRICES.name, "acme/agt-poisoned"),
            RENTALS.name: await poison(store, RENTALS.name, "wl-bad-a1"),
            LEDGER.name: await poison(store, LEDGER.name, "charge:wl-1-a1:1"),
            ALERT_RULES.name: await poison(store, ALERT_RULES.name, "bad_rule"),
            SILENCES.name: await poison(store, SILENCES.name, "sil-bad"),
            WEBHOOKS.name: await poison(store, WEBHOOKS.name, "wh-bad"),
            Aggregate.HOST_ROLLUPS: await poison(store, Aggregate.HOST_ROLLUPS, "agt-1", minute=2),
            Aggregate.HOST_HOURLY_ROLLUPS: await poison(store, Aggregate.HOST_HOURLY_ROLLUPS, "agt-1", minute=120),
            OUTPUTS.name: await poison(store, OUTPUTS.name, "wl-1:r0:a2"),
            Aggregate.SECRETS: await poison(store, Aggregate.SECRETS, "alice/poisoned"),
            SSH_KEYS.name: await poison(store, SSH_KEYS.name, "sshk-bad"),
            ENDPOINTS.name: await poison(store, ENDPOINTS.name, "ep-bad"),
            ENDPOINT_KEYS.name: await poison(store, ENDPOINT_KEYS.name, "epk-bad"),
            ENDPOINT_REQUESTS.name: await poison(store, ENDPOINT_REQUESTS.name, "req-bad"),
            TOPUPS.name: await poison(store, TOPUPS.name, "tu-bad"),
            PAYMENT_EVENTS.name: await poison(store, PAYMENT_EVENTS.name, "stripe:evt_bad"),
            BILLING.name: await poison(store, BILLING.name, "bill-bad"),
            PAYOUT_ACCOUNTS.name: await poison(store, PAYOUT_ACCOUNTS.name, "payacct-bad"),
            PAYOUTS.name: await poison(store, PAYOUTS.name, "payout:bad:2026-W49"),
            DISPUTES.name: await poison(store, DISPUTES.name, "dsp-bad"),
        }
    finally:
        await store.close()


async def _reported(client: TestClient, auth: dict[str, str], count: int) -> list[dict[str, Any]]:
    """The store.quarantined events, once there are ``count`` of them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REPORT_TIMEOUT_S
    while True:
        response = await client.get("/api/v1/events", params={"kind": "store.quarantined", "limit": "100"}, headers=auth)
        assert response.status == 200
        items: list[dict[str, Any]] = (await response.json())["items"]
        if len(items) >= count or loop.time() > deadline:
            return items
        await asyncio.sleep(0.1)


async def test_the_master_starts_and_serves_with_an_undecodable_record_in_every_table_and_reports_each(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="master.store.quarantine")
    bad = await _plant_good_and_bad_records(store_url)
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0), store=open_store(store_url))
    await master.start()  # the incident: this raised, and the Master could not start again
    client = TestClient(TestServer(api_app(master)))
    await client.start_server()
    try:
        auth = {"Authorization": f"Bearer {await master.create_api_key('operator')}"}

        # What the Master loads at start is served without the bad records.
        agents = await (await client.get("/api/v1/agents", headers=auth)).json()
        assert [a["id"] for a in agents["items"]] == ["agt-1"]
        assert [g["uuid"] for g in agents["items"][0]["gpus"]] == ["GPU-a"]
        commands = await client.get("/api/v1/commands", headers=auth)
        assert commands.status == 200 and [c["id"] for c in (await commands.json())["items"]] == ["cmd-1"]
        assert [r.serial for r in await master.store.revocations.list()] == ["0a"]
        workloads = await client.get("/api/v1/workloads", headers=auth)
        assert workloads.status == 200 and [w["id"] for w in (await workloads.json())["items"]] == ["wl-1"]
        one = await client.get("/api/v1/workloads/wl-1", headers=auth)  # its kept output, the bad record skipped
        assert one.status == 200 and [o["attempt"] for o in (await one.json())["outputs"]] == [1]

        # What it reads on demand is served too, and an unreadable credential is refused, not a crash.
        events = await client.get("/api/v1/events", headers=auth)
        assert events.status == 200
        assert (await client.get("/api/v1/agents", headers={"Authorization": f"Bearer {POISONED_API_KEY}"})).status == 401
        with pytest.raises(EnrollmentError) as refused:
            await master.enrollment.enroll(POISONED_TOKEN, make_csr(generate_key(), "host").decode())
        assert refused.value.code == "token_unknown"
        assert [r.minute for r in await master.store.rollups.list("GPU-a")] == [1]  # the telemetry history's read
        assert [r.minute for r in await master.store.hourly_rollups.list("GPU-a")] == [60]  # and its hourly one
        assert [r.minute for r in await master.store.host_rollups.list("agt-1")] == [1]  # a host's own history
        assert [r.minute for r in await master.store.host_hourly_rollups.list("agt-1")] == [60]
        host_history = await client.get("/api/v1/agents/agt-1/telemetry?from=0&to=10800&step=3600", headers=auth)
        assert host_history.status == 200  # reads the host's hours, the bad one skipped
        assert [p["ts"] for p in (await host_history.json())["host_points"]] == ["1970-01-01T01:00:00.000Z"]
        assert [u.account for u in await fair_share_repo(master.store).list()] == ["alice"]  # what a scheduling loop loads
        accounts = await client.get("/api/v1/accounts", headers=auth)
        assert accounts.status == 200 and [a["id"] for a in (await accounts.json())["items"]] == ["operator"]
        # The market's: prices (loaded at start), rentals and a rental's ledger entries (read on demand).
        prices = await (await client.get("/api/v1/prices", headers=auth)).json()
        assert [(p["provider"], p["agent_id"]) for p in prices["items"]] == [("acme", None)]
        rentals = await client.get("/api/v1/rentals", headers=auth)
        assert rentals.status == 200 and [r["id"] for r in (await rentals.json())["items"]] == ["wl-1-a1"]
        rental = await client.get("/api/v1/rentals/wl-1-a1", headers=auth)
        assert rental.status == 200 and (await rental.json())["charged"] == "0.00"

        # Alerting's: rules, silences and webhooks (loaded on the first alert call).
        rules = await client.get("/api/v1/alert-rules", headers=auth)
        assert rules.status == 200 and all(r["source"] == "file" for r in (await rules.json())["items"])
        silences = await client.get("/api/v1/silences", headers=auth)
        assert silences.status == 200 and (await silences.json())["items"] == []
        webhooks = await client.get("/api/v1/webhooks", headers=auth)
        assert webhooks.status == 200 and (await webhooks.json())["items"] == []

        # A renter's secrets (read when it lists them or a create needs them): the bad one skipped.
        await master.secrets.create("alice", "good", "value")
        assert [s.name for s in await master.secrets.list("alice")] == ["good"]

        # An account's SSH keys (read when it lists them or opens an ssh tunnel): the bad one skipped.
        keys = await client.get("/api/v1/ssh-keys?account=alice", headers=auth)
        assert keys.status == 200 and (await keys.json())["items"] == []

        # An account's endpoints and an endpoint's invocation keys (read when listed): the bad ones skipped.
        endpoints = await client.get("/api/v1/endpoints?account=alice", headers=auth)
        assert endpoints.status == 200 and (await endpoints.json())["items"] == []
        assert await endpoint_key_repo(master.store).list("ep-1") == []
        # An endpoint's open requests (what a request book loads at start): the bad one skipped.
        requests = await endpoint_request_repo(master.store).list(states=["queued", "in_progress"])
        assert [r.id for r in requests] == ["req-1"]
        # Top-ups (read when listed) and the payment provider's events (read when one is delivered): the bad ones skipped.
        topups = await client.get("/api/v1/billing/topups", headers=auth)
        assert topups.status == 200 and (await topups.json())["items"] == []
        assert await payment_event_repo(master.store).get("stripe:evt_bad") is None
        # Billing settings (read by the auto top-up and spend cap loops, page by page): the bad one skipped.
        assert await billing_repo(master.store).list() == []
        # Payout accounts and payouts (read by the payout run, page by page; payouts when listed): the bad ones skipped.
        assert await payout_account_repo(master.store).list() == []
        payouts = await client.get("/api/v1/billing/payouts", headers=auth)
        assert payouts.status == 200 and (await payouts.json())["items"] == []
        # Disputes (read when listed): the bad one skipped.
        disputes = await client.get("/api/v1/disputes", headers=auth)
        assert disputes.status == 200 and (await disputes.json())["items"] == []

        # Each bad record is reported: an event naming its aggregate and key, a log line, a count.
        reported = await _reported(client, auth, len(Aggregate) + len(AGGREGATES))
        assert sorted((e["data"]["aggregate"], e["subject"]) for e in reported) == sorted(
            (str(aggregate), key) for aggregate, key in bad.items()
        )
        assert {e["data"]["backend"] for e in reported} == {master.store.backend}
        logged = {(r.aggregate, r.key) for r in caplog.records if "quarantined" in r.getMessage()}  # type: ignore[attr-defined]
        assert logged == {(str(aggregate), key) for aggregate, key in bad.items()}
        assert len(master.store.quarantine) == len(Aggregate) + len(AGGREGATES)
    finally:
        await client.close()
        await master.stop()


async def test_a_command_with_a_nan_timeout_is_refused_and_the_commands_stay_listable(store_url: str, tmp_path: Path) -> None:
    """The incident's first half: the store is the last line of defence, whatever the API lets through."""
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0), store=open_store(store_url))
    await master.start()
    client = TestClient(TestServer(api_app(master)))
    await client.start_server()
    try:
        auth = {"Authorization": f"Bearer {await master.create_api_key('operator')}"}
        await add_agent(master, "agt-a", "h100:1")
        spec = json.dumps({"name": "ig-job", "image": "busybox"})
        body = f'{{"agent_id": "agt-a", "kind": "create_container", "spec": {spec}, "timeout_s": NaN}}'
        created = await client.post("/api/v1/commands", data=body, headers=auth | {"Content-Type": "application/json"})
        assert created.status == 400, await created.text()  # unstorable_record here; bad_request once the API checks
        listed = await client.get("/api/v1/commands", headers=auth)
        assert listed.status == 200 and (await listed.json())["items"] == []
        assert master.commands.open == {}
    finally:
        await client.close()
        await master.stop()


async def test_the_master_starts_when_its_own_operator_account_is_unreadable(store_url: str, tmp_path: Path) -> None:
    """The operator account is ensured at every start; an undecodable one is quarantined and left, not a crash."""
    store = open_store(store_url)
    await store.open()
    try:
        await poison(store, Aggregate.ACCOUNTS, "operator")
    finally:
        await store.close()
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0), store=open_store(store_url))
    await master.start()
    try:
        assert await master.store.accounts.get("operator") is None  # still there, still unreadable, and reported
        assert len(master.store.quarantine) == 1
    finally:
        await master.stop()
