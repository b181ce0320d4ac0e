"""The Master's guards against double-booked GPUs, oversized or stale inventories and silent departures,
checked through the real API against real Master, relay and agent processes."""

from __future__ import annotations

import asyncio
import json
import signal
import time

from websockets.asyncio.client import connect

from common.pki import client_tls_context
from common.wire import encode
from tests.master.linked import gpus, hello
from tests.support.grid import Grid, wait_for, write_toml


def create(grid, agent_id: str, name: str, gpus: list[str]) -> tuple[int, dict]:
    spec = {"name": name, "image": "none", "command": ["sleep", "300"], "gpus": gpus}
    return grid.call("POST", "/api/v1/commands", {"agent_id": agent_id, "kind": "create_container", "spec": spec})


def gpu_states(grid, agent_id: str) -> dict[str, str]:
    return {g["uuid"]: g["state"] for g in grid.agent(agent_id)["gpus"]}


def test_a_second_container_on_a_held_gpu_is_refused_with_409_and_a_delete_frees_only_its_own(grid):
    agent_id, _ = grid.run_agent("host-a", simulate="h100:2")
    first, second = sorted(gpu_states(grid, agent_id))

    status, body = create(grid, agent_id, "job-1", [first])
    assert status == 202, body
    status, refused = create(grid, agent_id, "job-2", [first])
    assert status == 409, refused
    assert "held by container 'job-1'" in str(refused)
    status, refused = create(grid, agent_id, "job-3", ["GPU-not-on-this-host"])
    assert status == 409 and "not on host" in str(refused), refused

    assert grid.wait_command(body["id"])["state"] == "succeeded"
    status, other = create(grid, agent_id, "job-4", [second])
    assert status == 202 and grid.wait_command(other["id"])["state"] == "succeeded"
    assert gpu_states(grid, agent_id) == {first: "busy", second: "busy"}

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "job-1"}))
    assert deleted["state"] == "succeeded", deleted
    assert gpu_states(grid, agent_id) == {first: "available", second: "busy"}


def test_a_host_reporting_more_gpus_than_allowed_is_refused_and_nothing_registered(grid):
    assert grid.enroll("big-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("big-host")
    daemon = grid.start_agent("big-host", simulate="h100:20")
    refused = wait_for(
        lambda: grid.get(f"/api/v1/events?kind=agent.hello_refused&subject={agent_id}")["items"],
        30,
        f"the hello to be refused\n{daemon.tail()}",
    )
    assert refused[0]["data"]["code"] == "inventory_too_large"
    agent = grid.agent(agent_id)
    assert agent["state"] == "enrolled" and agent["gpus"] == []
    assert [g for g in grid.get("/api/v1/gpus")["items"] if g["agent_id"] == agent_id] == []


def test_a_clean_stop_shows_at_once_and_a_restart_with_other_gpus_replaces_the_inventory(grid):
    agent_id, daemon = grid.run_agent("host-b", simulate="h100:2")
    old = set(gpu_states(grid, agent_id))
    daemon.kill(signal.SIGTERM)
    stopped = time.monotonic()
    agent = wait_for(lambda: (a := grid.agent(agent_id))["state"] == "offline" and a, 10, "the agent to show offline")
    # Heartbeats here are 1 s and three may be missed: a reason naming the disconnect is what shows it was not the sweep.
    assert agent["state_reason"].startswith("disconnected from relay relay-1"), agent["state_reason"]
    assert time.monotonic() - stopped < 10  # the wait's deadline: offline on the disconnect, not after heartbeats lapse

    grid.run_agent("host-b", simulate="a10:1")  # the same host back with another card
    new = gpu_states(grid, agent_id)
    assert len(new) == 1 and not (set(new) & old) and list(new.values()) == ["available"]
    assert not any(g["uuid"] in old for g in grid.get("/api/v1/gpus")["items"])


def test_agents_behind_a_relay_that_dies_show_offline_at_once_naming_the_relay(grid):
    agent_id, _ = grid.run_agent("host-c", simulate="a10:1")
    grid.relays["relay-1"].daemon.kill(signal.SIGKILL)
    agent = wait_for(lambda: (a := grid.agent(agent_id))["state"] == "offline" and a, 10, "the agent to show offline")
    assert agent["state_reason"] == "relay relay-1 lost", agent["state_reason"]  # not the sweep's "no heartbeat"
    assert [g["state"] for g in agent["gpus"]] == ["offline"]


async def test_an_agents_event_flood_is_cut_to_its_budget_and_never_reaches_the_masters_kinds(tmp_path):
    grid = Grid(tmp_path)
    try:
        budget = write_toml(tmp_path / "master.toml", {"report_events_per_window": 10, "report_window_s": 3600})
        grid.start_master("--config", str(budget))
        relay = grid.start_relay("relay-1", "eu-west")
        assert grid.enroll("flooder", relay).returncode == 0
        agent_id, home = grid.agent_id("flooder"), grid.agent_dir("flooder")
        context = client_tls_context(home / "ca.crt", home / "agent.crt", home / "agent.key")
        async with connect(relay.agent_url, ssl=context, open_timeout=5) as ws:
            await ws.send(encode(hello(gpus(1))).decode())
            while json.loads(await asyncio.wait_for(ws.recv(), timeout=10))["type"] != "welcome":
                pass
            report = {"type": "event", "kind": "runtime_failure", "ts": 1.0, "message": "x" * 500}
            for _ in range(150):
                await ws.send(json.dumps(report))
            forged = {"type": "event", "kind": "transition", "ts": 1.0, "message": "revoked by an operator"}
            await ws.send(json.dumps(forged))
            while (answer := json.loads(await asyncio.wait_for(ws.recv(), timeout=10)))["type"] != "error":
                pass
            assert answer["code"] == "schema_violation"

            def reports() -> list[dict]:
                return grid.get(f"/api/v1/events?subject={agent_id}&kind=agent_report.&limit=1000")["items"]

            noted = await asyncio.to_thread(
                wait_for, lambda: [e for e in reports() if e["kind"] == "agent_report.budget_exceeded"], 20, "the flood noted"
            )
        kinds = [e["kind"] for e in reports()]
        assert kinds.count("agent_report.runtime_failure") == 10 and len(noted) == 1
        for prefix in ("agent.", "gpu.", "command."):
            listed = grid.get(f"/api/v1/events?kind={prefix}&limit=1000")["items"]
            assert not any("revoked by an operator" in json.dumps(e) for e in listed)
    finally:
        grid.stop()
