"""``idlegrid alert ...`` against a real Master with its API (in a thread of this process), read as a stranger reads
it: what fires with its rule, subject and value; who sees which alert; silences only the operator may write; a
webhook's secret printed once. The GPU is simulated (no GPU here); its Xid goes through the Master's fault path."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from common.inventory import GpuSample
from common.wire import AgentEvent, AgentEventKind
from management.cli import main as cli
from tests.management.cli.test_accounts import idlegrid, served  # noqa: F401  # the served Master and the CLI runner
from tests.management.hosts import add_agent, api_key


def in_master(served, coro):  # noqa: F811
    return asyncio.run_coroutine_threadsafe(coro, served.loop).result(timeout=30)


async def _xid_on_a_gpu_of(master, agent_id: str, provider: str) -> str:
    await add_agent(master, agent_id, "a10:1", provider=provider, runtime="simulated", isolation="container")
    gpu = master.gpus(agent_id)[0]
    report = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=gpu.uuid, code=79)
    await master.registry.mark_faulty(gpu, master.health.on_report(gpu, report, time.time()))
    return gpu.uuid


def _key(served, role: str, account: str) -> str:  # noqa: F811
    header = in_master(served, api_key(served.server.master, role, account))
    return header["Authorization"].removeprefix("Bearer ")


def test_a_firing_alert_is_listed_to_the_operator_and_the_owner_only(idlegrid, served):  # noqa: F811
    master = served.server.master
    uuid = in_master(served, _xid_on_a_gpu_of(master, "agt-acme", "acme"))
    in_master(served, served.server.services.alerts.loop.step())

    # The Master also has relay-1 pending as down (the test's host came through it; no relay is linked here).
    lines = idlegrid("alert", "list").splitlines()
    blank = lines.index("")
    assert lines[0].split() == ["PHASE", "RULE", "SUBJECT", "VALUE", "SINCE", "FIRED", "HOST", "OWNER"]
    [row] = [line.split() for line in lines[1:blank] if "gpu_hardware_error" in line]
    assert row[:4] == ["firing", "gpu_hardware_error", uuid, "1"] and row[-2:] == ["agt-acme", "acme"]
    assert lines[blank + 1] == "recent transitions (newest first, 1 of 1):"
    assert lines[blank + 2].split() == ["AT", "PHASE", "SEVERITY", "RULE", "SUBJECT", "VALUE", "SUMMARY"]
    assert lines[blank + 3].split()[2:7] == ["firing", "critical", "gpu_hardware_error", uuid, "1"]

    assert uuid in idlegrid("alert", "list", "--api-key", _key(served, "provider", "acme"))
    other = idlegrid("alert", "list", "--api-key", _key(served, "provider", "bolt"))
    assert other.strip() == "no alert is pending or firing"  # neither acme's GPU nor the relay (the operator's)
    assert idlegrid("alert", "list", "--severity", "info").strip() == "no alert is pending or firing"
    shown = json.loads(idlegrid("alert", "list", "--json", "--phase", "firing"))
    assert [(a["rule"], a["subject"]) for a in shown["items"]] == [("gpu_hardware_error", uuid)]


def test_the_rules_in_force_read_as_conditions(idlegrid):  # noqa: F811
    rows = {line.split()[0]: line for line in idlegrid("alert", "rules").splitlines()[1:]}
    assert "gpu.temperature_c > 85 for 120s" in rows["gpu_overheating"]
    assert "past 80 for 60s" in rows["gpu_overheating"] and rows["gpu_overheating"].split()[-2:] == ["yes", "file"]


def _usage_error(capsys, *args: str) -> str:
    """A mistake argparse catches before any call: exit status 2 and one line saying what to type."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    assert exited.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_only_the_operator_silences_and_a_silence_can_be_ended_early(idlegrid, served, capsys):  # noqa: F811
    renter = _key(served, "renter", "bob")
    err = idlegrid("alert", "silence", "--for", "1h", "--rule", "gpu_overheating", "--api-key", renter, ok=False)
    assert err.strip() == "idlegrid alert silence: 403 forbidden: a renter key may not write silences"
    assert "a silence needs a duration, e.g. 30m" in _usage_error(capsys, "alert", "silence", "--for", "0")
    assert "'acme' is not a label matcher" in _usage_error(capsys, "alert", "silence", "--for", "1h", "--label", "acme")

    made = idlegrid(
        "alert", "silence", "--for", "2h", "--rule", "gpu_overheating", "--label", "provider=acme", "--comment", "fans",
    )  # fmt: skip
    header, row = made.splitlines()
    silence_id = row.split()[0]
    assert header.split() == ["ID", "RULE", "SUBJECT", "LABELS", "EXPIRES", "BY", "COMMENT"]
    assert row.split()[1:4] == ["gpu_overheating", "-", "provider=acme"] and row.split()[-1] == "fans"
    assert silence_id in idlegrid("alert", "silences")
    idlegrid("alert", "unsilence", silence_id)
    assert idlegrid("alert", "silences").strip() == "no silence"
    assert silence_id in idlegrid("alert", "silences", "--all")
    assert "404 not_found" in idlegrid("alert", "unsilence", "sil-nope", ok=False)


def test_a_webhooks_secret_is_printed_once_and_the_webhook_removed(idlegrid, served):  # noqa: F811
    provider = _key(served, "provider", "acme")
    added = idlegrid("alert", "webhook", "add", "https://hooks.example.net/acme", "--api-key", provider)
    webhook_id = added.splitlines()[1].split()[0]
    [secret_line] = [line for line in added.splitlines() if line.startswith("secret: ")]
    assert len(secret_line.removeprefix("secret: ")) >= 32
    listed = idlegrid("alert", "webhook", "list", "--api-key", provider)
    assert webhook_id in listed and "secret" not in listed
    assert "no webhook" in idlegrid("alert", "webhook", "list", "--api-key", _key(served, "provider", "bolt"))
    assert idlegrid("alert", "webhook", "remove", webhook_id, "--api-key", provider).strip() == f"webhook {webhook_id} removed"
    assert "no webhook" in idlegrid("alert", "webhook", "list", "--api-key", provider)


def test_the_operator_puts_a_rule_that_fires_then_deletes_it(idlegrid, served, capsys):  # noqa: F811
    master = served.server.master
    in_master(served, add_agent(master, "agt-hot", "a10:1", provider="acme", runtime="simulated", isolation="container"))
    uuid = master.gpus("agt-hot")[0].uuid
    made = idlegrid(
        "alert", "rule", "set", "warm_gpu", "--metric", "gpu.temperature_c", "--op", ">", "--threshold", "60",
        "--clear-threshold", "55", "--clear-for", "1m", "--summary", "warmer than we like",
    )  # fmt: skip
    assert made.splitlines()[1].split() == [
        "warm_gpu",
        "gpu.temperature_c",
        ">",
        "60",
        "past",
        "55",
        "for",
        "60s",
        "warning",
        "gpu",
        "api",
    ]
    master.telemetry.ingest("agt-hot", [GpuSample(uuid=uuid, ts=time.time(), temperature_c=71.0)])
    in_master(served, served.server.services.alerts.loop.step())
    [row] = idlegrid("alert", "list", "--rule", "warm_gpu", "--recent", "0").splitlines()[1:]
    assert row.split()[:4] == ["firing", "warm_gpu", uuid, "71"]

    assert "'5 minutes': write a duration" in _usage_error(
        capsys, "alert", "rule", "set", "x", "--metric", "m", "--op", ">", "--threshold", "1", "--for", "5 minutes"
    )
    err = idlegrid("alert", "rule", "set", "Bad-Name", "--metric", "gpu.temperature_c", "--op", ">", "--threshold", "1", ok=False)
    assert err.startswith("idlegrid alert rule set: 400 bad_request") and len(err.splitlines()) == 1
    renter = _key(served, "renter", "bob")
    assert "403 forbidden" in idlegrid("alert", "rule", "delete", "warm_gpu", "--api-key", renter, ok=False)
    assert idlegrid("alert", "rule", "delete", "warm_gpu").strip() == "rule warm_gpu deleted"
    assert "warm_gpu" not in idlegrid("alert", "rules")
