"""The fleet simulator: real agents (the agent's own code) against a real Master and relay, in one process.

Only the host is simulated: GPUs, the container runtime (latency, failures) and the command ledger kept in memory.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest

from access.config import AccessConfig
from access.daemon import AccessRelay
from agent.daemon import Agent
from agent.ledger import CommandLog
from agent.runtime import open_runtime
from agent.runtime.simulated import SimulatedRuntime
from bench.fleet import FleetOptions
from bench.fleet_agents import (
    Fleet,
    FleetSettings,
    MemoryCommandLog,
    SimulatedAgent,
    build_parser,
    host_gpus,
    load_settings,
    source_address,
)
from bench.provision import provision_agents
from common.containers import LABEL_COMMAND_ID, ContainerSpec
from common.errors import ConfigError, RuntimeFailure
from common.pki import CertRole
from master.config import MasterConfig
from master.master import Master

FINAL = {"succeeded", "failed", "timed_out", "cancelled"}


# --- the simulated runtime -------------------------------------------------------------------------


def spec(name: str = "job") -> ContainerSpec:
    return ContainerSpec(name=name, image="bench/none", command=["sleep", "1"])


async def test_the_simulated_runtime_is_registered_under_its_kind():
    runtime = open_runtime("simulated", latency_s=0.0, failure_rate=0.0)
    assert isinstance(runtime, SimulatedRuntime)
    with pytest.raises(ConfigError):
        open_runtime("simulated", no_such_option=1)


async def test_a_create_takes_the_configured_latency_and_is_journalled():
    runtime = SimulatedRuntime(latency_s=0.05)
    started = time.monotonic()
    info = await runtime.create(spec(), labels={LABEL_COMMAND_ID: "cmd-1"})
    assert time.monotonic() - started >= 0.045
    assert info.state == "running" and info.runtime == "simulated"
    assert [c.name for c in await runtime.list()] == ["job"]
    assert runtime.executions() == {"cmd-1": 1}


async def test_creating_again_under_the_same_command_id_runs_nothing_more():
    runtime = SimulatedRuntime()
    first = await runtime.create(spec(), labels={LABEL_COMMAND_ID: "cmd-1"})
    again = await runtime.create(spec(), labels={LABEL_COMMAND_ID: "cmd-1"})
    assert again == first and runtime.executions() == {"cmd-1": 1}
    with pytest.raises(RuntimeFailure, match="already exists"):
        await runtime.create(spec(), labels={LABEL_COMMAND_ID: "cmd-2"})


async def test_failures_come_at_the_configured_rate_and_are_journalled_as_failed():
    always = SimulatedRuntime(failure_rate=1.0)
    with pytest.raises(RuntimeFailure, match="simulated create failure"):
        await always.create(spec(), labels={LABEL_COMMAND_ID: "cmd-1"})
    assert await always.list() == [] and [e.ok for e in always.journal] == [False]

    some = SimulatedRuntime(failure_rate=0.3, seed=7)
    failed = 0
    for n in range(400):
        try:
            await some.create(spec(f"job-{n}"), labels={LABEL_COMMAND_ID: f"cmd-{n}"})
        except RuntimeFailure:
            failed += 1
    assert 80 <= failed <= 160


async def test_delete_removes_and_reports_removed_and_a_missing_name_is_none():
    runtime = SimulatedRuntime()
    await runtime.create(spec(), labels={LABEL_COMMAND_ID: "cmd-1"})
    removed = await runtime.delete("job")
    assert removed is not None and removed.state == "removed"
    assert await runtime.delete("job") is None
    assert await runtime.list() == []


def test_bad_runtime_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="failure_rate"):
        SimulatedRuntime(failure_rate=1.5)
    with pytest.raises(ValueError, match="negative"):
        SimulatedRuntime(latency_s=-1)


# --- the in-memory ledger answers as the SQLite one does -------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_the_memory_ledger_keeps_the_command_log_contract(tmp_path, kind):
    log = CommandLog(tmp_path / "commands.db") if kind == "sqlite" else MemoryCommandLog()
    assert log.get("cmd-1") is None
    log.start("cmd-1", "create_container")
    started = log.get("cmd-1")
    assert started is not None and not started.finished and log.unacked() == []
    log.finish("cmd-1", "create_container", ok=True, result={"container": None}, error=None, error_code=None)
    log.start("cmd-1", "create_container")  # a repeat start leaves the finished entry alone
    log.finish("cmd-2", "delete_container", ok=False, result={}, error="no", error_code="runtime_failure")
    assert [e.id for e in log.unacked()] == ["cmd-1", "cmd-2"]
    entry = log.get("cmd-1")
    assert entry is not None and entry.finished and entry.ok and entry.result == {"container": None}
    log.mark_acked("cmd-1")
    assert [e.id for e in log.unacked()] == ["cmd-2"] and log.count() == 2
    log.close()


# --- settings and the command line -----------------------------------------------------------------


def test_settings_come_from_flags_and_bad_ones_are_named():
    args = build_parser().parse_args(["--agents-dir", "x", "--access", "wss://127.0.0.1:1", "--failure-rate", "0.1"])
    settings = load_settings(args)
    assert settings.failure_rate == 0.1 and settings.access_urls == ["wss://127.0.0.1:1"]
    bad = build_parser().parse_args(["--agents-dir", "x", "--access", "wss://h:1", "--failure-rate", "2"])
    with pytest.raises(ConfigError, match="failure_rate"):
        load_settings(bad)


def test_each_simulated_host_gets_a_loopback_address_of_its_own():
    addresses = {source_address(i) for i in range(70_000)}
    assert len(addresses) == 70_000 and all(a.startswith("127.") for a in addresses)


# --- a fleet against a real Master and relay -------------------------------------------------------


@pytest.fixture
async def grid(tmp_path: Path):
    """A Master and one relay in this process, on free ports, and four agents enrolled by the Master's own code."""
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0, heartbeat_s=1.0, telemetry_s=1.0, rollup_flush_s=1.0)
    provisioned = await provision_agents(config, tmp_path / "agents", 4)
    master = Master(config)
    await master.start()
    cert, key, ca = master.authority.write_server_identity(tmp_path / "relay", CertRole.ACCESS, "relay-1")
    relay = AccessRelay(
        AccessConfig(
            master_url=master.link_url, agent_port=0, http_port=0, cert_file=str(cert), key_file=str(key), ca_file=str(ca)
        )
    )
    await relay.start()
    await relay.link.wait_up(10)
    try:
        yield master, relay, provisioned.agent_ids, tmp_path / "agents"
    finally:
        await relay.stop()
        await master.stop()


async def _final(master: Master, command_id: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = (await master.commands.get(command_id)).state
        if state in FINAL:
            return state
        await asyncio.sleep(0.02)
    raise AssertionError(f"command {command_id} did not finish in {timeout} s")


async def test_a_fleet_of_real_agents_gets_ready_reports_and_runs_each_command_once(grid):
    master, relay, agent_ids, agents_dir = grid
    fleet = Fleet(
        FleetSettings(
            agents_dir=str(agents_dir),
            access_urls=[relay.agent_url],
            simulate="h100:2",
            connect_rate=100,
            latency_ms=10,
            jitter_ms=0,
        )
    )
    fleet.load()
    assert all(isinstance(a, Agent) and isinstance(a, SimulatedAgent) for a in fleet.agents)  # the agent's own code
    await fleet.start()
    try:
        assert await fleet.wait_ready(20), fleet.stats()
        assert {a for a in agent_ids if master.registry.agents[a].state == "ready"} == set(agent_ids)
        assert len(master.registry.gpus) == 8  # 2 simulated GPUs per agent, known to the Master

        # Ready: the automatic collector is off, and the fleet collects the young generation itself each second
        young_before = gc.get_stats()[0]["collections"]
        assert not gc.isenabled()

        target = agent_ids[0]
        record = await master.commands.create(target, ContainerSpec(name="c1", image="bench/none"))
        assert await _final(master, record.id) == "succeeded"
        await master.commands.resend_for(target)  # a resend of a finished command: answered, not run again
        await asyncio.sleep(1.5)  # a heartbeat or so, for telemetry and the resend to arrive
        assert gc.get_stats()[0]["collections"] > young_before
        came, ack_out, result_out = fleet.marks[record.id]  # the command's times at its agent, for bench.fleet's phases
        assert 0 < came <= ack_out <= result_out

        stats = fleet.stats()
        assert stats["ready"] == 4 and stats["all_ready_s"] is not None
        assert stats["commands_executed"] == 1 and stats["duplicate_executions"] == 0
        assert stats["sent"]["hello"] == 4 and stats["sent"]["heartbeat"] >= 4 and stats["sent"].get("telemetry", 0) >= 1
        # samples arrived through the relay (folded there: up to one fold interval later than they were sent)
        deadline = time.monotonic() + 5.0
        while not master.telemetry.latest and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert master.telemetry.latest

        flood = await fleet.flood(rate=200, agents=2, seconds=0.5)
        assert flood["agents"] == 2 and flood["sent"] >= 50
    finally:
        await fleet.stop()
    assert fleet.stats()["open"] == 0
    assert gc.isenabled()


async def test_failures_of_the_simulated_runtime_reach_the_master_as_failed_commands(grid):
    master, relay, agent_ids, agents_dir = grid
    fleet = Fleet(
        FleetSettings(
            agents_dir=str(agents_dir),
            access_urls=[relay.agent_url],
            simulate="a10:1",
            count=1,
            failure_rate=1.0,
            latency_ms=0,
            jitter_ms=0,
        )
    )
    fleet.load()
    await fleet.start()
    try:
        assert await fleet.wait_ready(20)
        record = await master.commands.create(agent_ids[0], ContainerSpec(name="c1", image="bench/none"))
        assert await _final(master, record.id) == "failed"
        assert "simulated create failure" in ((await master.commands.get(record.id)).error or "")
        assert fleet.stats()["failed_executions"] == 1
    finally:
        await fleet.stop()


def test_the_simulated_agent_overrides_nothing_of_the_agent_and_builds_on_its_public_seams():
    """The fleet measures the agent's own code: what it changes goes through Agent's constructor (runtime, ledger,
    host, connector, directory, observer), never by replacing one of its methods or attributes."""
    inherited = {name for name in dir(Agent) if not name.startswith("__")}
    assert set(vars(SimulatedAgent)) & inherited == set()


def test_no_class_of_the_simulated_fleet_replaces_a_private_method_of_the_agents_part_it_builds_on():
    """Issue 38, point 4: the fleet's ledger, connector and agent extend the agent's parts through their public
    methods (what the agent calls on a ledger or a connector it is given), never one of their private ones."""
    import inspect

    import bench.fleet_agents

    replaced = {}
    for name, cls in vars(bench.fleet_agents).items():
        if not inspect.isclass(cls) or cls.__module__ != bench.fleet_agents.__name__:
            continue
        for base in cls.__mro__[1:]:
            if base.__module__.startswith("agent."):
                private = {n for n in vars(cls) if n.startswith("_") and not n.startswith("__") and hasattr(base, n)}
                if private:
                    replaced[f"{name}({base.__name__})"] = sorted(private)
    assert replaced == {}


def test_a_fleet_without_enrolled_agents_says_how_to_get_them(tmp_path):
    fleet = Fleet(FleetSettings(agents_dir=str(tmp_path), access_urls=["wss://127.0.0.1:1"]))
    with pytest.raises(FileNotFoundError, match="provision the fleet first"):
        fleet.load()


def test_a_fleet_can_mix_vendors_its_agents_taking_the_models_in_turn():
    """Issue 41, point 5: `bench fleet --gpu-model h100,mi300x` simulates NVIDIA and AMD hosts alternately."""
    options = FleetOptions(gpu_model="h100,mi300x", gpus_per_agent=4)
    assert options.simulate == "h100:4|mi300x:4"
    assert [host_gpus(options.simulate, i) for i in range(4)] == ["h100:4", "mi300x:4", "h100:4", "mi300x:4"]
    assert host_gpus(FleetOptions(gpu_model="h100").simulate, 7) == "h100:8"
