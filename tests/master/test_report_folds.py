"""Folding changes what the Master pays, never what it knows (issue 42; docs/access.md, "Folding").

The same agent frames go through a real Access relay to a real Master (SQLite in tmp_path) twice: once frame by frame
(folding off), once folded (``report_fold`` frames, 0.1 s apart). Liveness, every telemetry sample, the stored
rollups, the agents' transitions and the alerts the shipped rules raise must be the same, sample by sample.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from websockets.asyncio.client import connect

from access.config import AccessConfig
from access.daemon import AccessRelay
from common.inventory import GpuSample, HostSample
from common.pki import CertRole, client_tls_context
from common.wire import (
    HARD_FRAME_BYTES,
    AgentConnected,
    Heartbeat,
    Relay,
    Telemetry,
    Welcome,
    decode_master_frame,
    encode,
)
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import load_rules
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import enrolled, gpus, hello

DEADLINE_S = 20.0
AGENTS = ("fold-a", "fold-b", "fold-c")
# Running containers each heartbeat reports: unchanged heartbeats after a pause are folded as alive only.
RUNNING: tuple[list[str], ...] = ([], [], [], [], ["c1"], ["c1"], ["c1"], [])
# After these rounds the agent waits until the Master has handled them (and notes the agent's state then), so the next
# fold starts with its heartbeat, unchanged (2, 3, 6) or not (4, 7); rounds 4 and 5 may share a fold.
SYNC_AFTER = (0, 1, 2, 3, 5, 6, 7)
EXPECTED_STATES = ["ready", "ready", "ready", "ready", "busy", "busy", "ready"]
MARKER = {"c1": {"10.9.0.2": "direct"}}  # the last heartbeat's overlay: it says everything before was handled


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def uuids(agent_id: str) -> list[str]:
    return [gpu.uuid for gpu in gpus(2, prefix=f"GPU-{agent_id}")]


def script(agent_id: str, t0: float) -> list[Heartbeat | Telemetry]:
    """What one agent sends after its welcome: heartbeats and telemetry, with temperatures that overheat and
    uncorrectable ECC errors on one GPU, spread over two minutes of samples."""
    frames: list[Heartbeat | Telemetry] = []
    for i, running in enumerate(RUNNING):
        frames.append(Heartbeat(seq=i, ts=t0 + 10 * i, running=running))
        samples = [
            GpuSample(
                uuid=uuid,
                ts=t0 + 10 * i + j,
                utilization_pct=float(10 * i + j),
                memory_used_mib=1000 * i,
                temperature_c=70.0 + 4 * i + j,
                power_w=300.0 + i,
                ecc_uncorrected=1 if i >= 6 and j == 0 else 0,
            )
            for j, uuid in enumerate(uuids(agent_id))
        ]
        frames.append(Telemetry(ts=t0 + 10 * i, samples=samples, host=HostSample(ts=t0 + 10 * i, cpu_pct=float(i))))
    frames.append(Heartbeat(seq=len(RUNNING), ts=t0 + 10 * len(RUNNING), overlay=MARKER))
    return frames


@dataclass
class Outcome:
    folds: float  # report folds the relay sent (0 with folding off)
    heard: set[str]
    states: dict[str, list[str]]  # each agent's state after each synchronised round
    frames_received: dict[str, float]
    samples: dict[str, dict[str, list[GpuSample]]]
    latest: dict[str, GpuSample]
    rollups: dict[str, list[Any]]
    transitions: dict[str, list[tuple[Any, ...]]]
    alerts: list[tuple[str, str, str]]


def relay_for(master: Master, tmp_path: Path, fold_interval_s: float) -> AccessRelay:
    cert, key, ca = master.authority.write_server_identity(tmp_path / "relay", CertRole.ACCESS, "relay-fold")
    return AccessRelay(
        AccessConfig(
            relay_id="relay-fold",
            region="eu-west",
            master_url=f"wss://127.0.0.1:{master.link_port}/link",
            agent_port=0,
            http_port=0,
            cert_file=str(cert),
            key_file=str(key),
            ca_file=str(ca),
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            drain_timeout_s=0.5,
            fold_interval_s=fold_interval_s,
        )
    )


def latest_ts(master: Master, uuid: str) -> float | None:
    sample = master.telemetry.latest.get(uuid)
    return sample.ts if sample is not None else None


async def play(master: Master, relay: AccessRelay, tmp_path: Path, agent_id: str, t0: float) -> tuple[bool, list[str]]:
    """The agent's frames through the relay; whether the Master heard it (liveness) once they were all handled, and the
    agent's state as the Master had it after each synchronised round."""
    cert, key, ca = master.authority.write_server_identity(tmp_path / agent_id, CertRole.AGENT, agent_id)
    context = client_tls_context(ca, cert, key)
    async with connect(relay.agent_url, ssl=context, open_timeout=5, max_size=HARD_FRAME_BYTES) as ws:
        await ws.send(encode(hello(gpus(2, prefix=f"GPU-{agent_id}"))).decode())
        while not isinstance(decode_master_frame(await ws.recv()), Welcome):
            pass
        states = []
        first = uuids(agent_id)[0]
        for i, frame in enumerate(script(agent_id, t0)):
            await ws.send(encode(frame).decode())
            if isinstance(frame, Telemetry) and i // 2 in SYNC_AFTER:
                sent = frame.samples[0].ts
                await until(lambda: latest_ts(master, first) == sent, f"{agent_id}'s round {i // 2}")  # noqa: B023
                states.append(master.registry.agents[agent_id].state)
        await until(lambda: master.registry.overlay_paths.get(agent_id) == MARKER, f"{agent_id}'s last heartbeat")
        heard = agent_id in master.hub.heard and master.registry.agents[agent_id].last_seen is not None
        return heard, states


def frames_received(master: Master) -> dict[str, float]:
    return {
        sample.labels["type"]: sample.value
        for metric in master.metrics.registry.collect()
        if metric.name == "idlegrid_master_frames_received"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def run(tmp_path: Path, t0: float, fold_interval_s: float) -> Outcome:
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    relay = relay_for(master, tmp_path, fold_interval_s)
    rules = [rule for rule in load_rules() if rule.name in ("gpu_overheating", "gpu_hardware_error")]
    clock = [t0 + 100]
    alerts = AlertLoop(FleetObserver(master), rules, clock=lambda: clock[0])
    try:
        await relay.start()
        await until(lambda: relay.link.is_up, "the relay's link")
        assert relay.link.folding is (fold_interval_s > 0)
        assert master.hub.links["relay-fold"].folds is (fold_interval_s > 0)  # what its hello said
        for agent_id in AGENTS:
            await enrolled(master, agent_id)
            master.telemetry.recent.watch(agent_id, time.time())
        played = await asyncio.gather(*(play(master, relay, tmp_path, agent_id, t0) for agent_id in AGENTS))
        # Each agent left when its frames were handled: the Master takes it offline (the same in both runs).
        await until(lambda: all(master.registry.agents[a].state == "offline" for a in AGENTS), "every agent offline")
        fired = [(t.rule, t.subject, t.phase) for t in await alerts.step()]
        clock[0] += 130
        fired += [(t.rule, t.subject, t.phase) for t in await alerts.step()]
        await master.telemetry.flush(time.time(), everything=True)
        events = await master.store.events.list(kind_prefix="agent.transition", limit=10_000)
        return Outcome(
            folds=relay.metrics.registry.get_sample_value("idlegrid_access_report_folds_total", {"relay": "relay-fold"}) or 0,
            heard={agent_id for agent_id, (heard, _) in zip(AGENTS, played, strict=True) if heard},
            states={agent_id: states for agent_id, (_, states) in zip(AGENTS, played, strict=True)},
            frames_received=frames_received(master),
            samples={agent_id: master.telemetry.recent.of(agent_id) for agent_id in AGENTS},
            latest={uuid: master.telemetry.latest[uuid] for agent_id in AGENTS for uuid in uuids(agent_id)},
            rollups={
                uuid: [msgspec.to_builtins(r) for r in await master.store.rollups.list(uuid)]
                for agent_id in AGENTS
                for uuid in uuids(agent_id)
            },
            transitions={
                agent_id: [
                    (e.data.get("old"), e.data.get("new"), e.data.get("event"), e.data.get("reason"))
                    for e in sorted(events, key=lambda e: e.ts)
                    if e.subject == agent_id
                ]
                for agent_id in AGENTS
            },
            alerts=sorted(fired),
        )
    finally:
        await relay.stop()
        await master.stop()


async def test_the_master_knows_the_same_sample_by_sample_with_folding_and_without(tmp_path):
    t0 = time.time() - 120  # the same sample dates in both runs
    unfolded = await run(tmp_path / "unfolded", t0, fold_interval_s=0.0)
    folded = await run(tmp_path / "folded", t0, fold_interval_s=0.1)

    assert unfolded.folds == 0 and folded.folds > 0  # the second run really folded
    # What the frames say is there to be compared: two minutes of samples on every GPU, a workload that started and
    # finished on every agent, and alerts that fired.
    assert {agent_id: states for agent_id, states in unfolded.states.items()} == dict.fromkeys(AGENTS, EXPECTED_STATES)
    assert all(len(ring) == len(RUNNING) for rings in unfolded.samples.values() for ring in rings.values())
    assert all(len(rollups) >= 2 for rollups in unfolded.rollups.values())
    assert all(
        [t[2] for t in steps if t[2] in ("workload_started", "workload_finished")] == ["workload_started", "workload_finished"]
        for steps in unfolded.transitions.values()
    )
    assert {rule for rule, _, phase in unfolded.alerts if phase == "firing"} == {"gpu_overheating", "gpu_hardware_error"}

    assert folded.samples == unfolded.samples
    assert folded.latest == unfolded.latest
    assert folded.rollups == unfolded.rollups
    assert folded.transitions == unfolded.transitions
    assert folded.states == unfolded.states
    assert folded.heard == unfolded.heard == set(AGENTS)
    assert folded.alerts == unfolded.alerts
    assert folded.frames_received == unfolded.frames_received


async def test_an_older_relay_that_says_nothing_of_folds_is_served_frame_by_frame(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    try:
        cert, key, ca = master.authority.write_server_identity(tmp_path / "relay", CertRole.ACCESS, "relay-old")
        url = f"wss://127.0.0.1:{master.link_port}/link"
        await enrolled(master, "agt-old")
        async with connect(url, ssl=client_tls_context(ca, cert, key), open_timeout=5) as link:
            # An older relay's hello, as it wrote it: no ``folds`` field.
            await link.send('{"type":"access_hello","versions":[1],"relay_id":"relay-old","region":"eu"}')
            welcome = msgspec.json.decode(await link.recv())
            assert welcome["type"] == "access_welcome" and welcome["folds"] is True  # it may ignore what it does not know
            assert master.hub.links["relay-old"].folds is False
            said = hello(gpus(1, prefix="GPU-old"))
            await link.send(encode(AgentConnected(agent_id="agt-old", serial="", cert_not_after=time.time() + 3600)))
            await link.send(encode(Relay(agent_id="agt-old", frame=msgspec.Raw(encode(said)))))
            await until(lambda: master.registry.agents["agt-old"].state == "ready", "the hello")
            beat = Heartbeat(seq=1, ts=time.time(), running=["c1"])
            await link.send(encode(Relay(agent_id="agt-old", frame=msgspec.Raw(encode(beat)))))
            await until(lambda: master.registry.agents["agt-old"].state == "busy", "the heartbeat, on its own")
    finally:
        await master.stop()
