"""The Master's metrics registry: fleet gauges read at scrape time, counters a person running it looks at,
and a body Prometheus's own checker accepts."""

from __future__ import annotations

import subprocess

from prometheus_client import generate_latest

from common.containers import ContainerSpec
from common.wire import CommandResult, Heartbeat
from tests.master.linked import connect, relay, relay_link


async def test_fleet_gauges_and_counters_are_in_the_masters_registry(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    await relay(master, link, "agt-a", Heartbeat(seq=1, ts=0.0))
    done = await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["0"]))
    await relay(master, link, "agt-a", CommandResult(id=done.id, ok=True))
    await master.channel.on_link_opened(link)

    value = master.metrics.registry.get_sample_value
    region = master.registry.agents["agt-a"].region or "none"
    assert value("idlegrid_agents", {"state": "busy", "region": region}) == 0
    assert value("idlegrid_agents", {"state": "ready", "region": region}) == 1
    gpu = master.registry.gpus["GPU-h100-0"]
    group = {"tier": gpu.tier or "none", "region": region, "model": gpu.model or "unknown"}
    assert value("idlegrid_gpus", {"state": "busy", **group}) == 1
    assert value("idlegrid_gpus", {"state": "available", **group}) == 1
    assert value("idlegrid_commands_open", {"state": "sent"}) == 0
    assert value("idlegrid_relays_connected") == 1
    assert value("idlegrid_master_frames_received_total", {"type": "hello"}) == 1
    assert value("idlegrid_master_frames_received_total", {"type": "heartbeat"}) == 1
    assert value("idlegrid_commands_finished_total", {"kind": "create_container", "state": "succeeded"}) == 1
    assert value("idlegrid_command_latency_seconds_count", {"kind": "create_container"}) == 1
    assert value("idlegrid_relay_links_opened_total") == 1


async def test_the_metrics_body_passes_promtool_and_names_no_agent(master):
    await connect(master, relay_link(), "agt-secret-id")
    body = generate_latest(master.metrics.registry)
    assert b"agt-secret-id" not in body and b"GPU-h100" not in body  # bounded labels: never ids
    checked = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
