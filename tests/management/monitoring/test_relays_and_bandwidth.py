"""Two of the issue's rules on a real Master (SQLite in tmp_path): a relay down (a real Access relay, its own
process's code run in this one, linked over mutual TLS with a certificate from the Master's CA) and a host's
bandwidth under the network floor of the tier its GPUs' hardware earns (hellos through the Master's link handler)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from access.config import AccessConfig
from access.daemon import AccessRelay
from common.pki import CertRole
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.evaluator import FIRING, RESOLVED
from management.monitoring.observe import HOST_BANDWIDTH_BELOW_FLOOR, RELAY_DOWN, FleetObserver
from management.monitoring.rules import load_rules
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import HOST, connect, gpus, relay_link

DEADLINE_S = 10.0


def shipped(name: str):
    [rule] = [r for r in load_rules() if r.name == name]
    return rule


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def relay_for(master: Master, tmp_path: Path, relay_id: str) -> AccessRelay:
    cert, key, ca = master.authority.write_server_identity(tmp_path / relay_id, CertRole.ACCESS, relay_id)
    return AccessRelay(
        AccessConfig(
            relay_id=relay_id,
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
        )
    )


async def test_a_relay_that_stays_unlinked_for_two_minutes_fires_and_resolves_when_it_is_back(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    relay = relay_for(master, tmp_path, "relay-eu")
    try:
        rule = shipped("relay_down")
        assert (rule.for_s, rule.severity, rule.scope) == (120, "critical", "relay")
        now = [time.time()]
        loop = AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0])
        assert await loop.step() == []  # no relay known yet: nothing reported
        await relay.start()
        await until(lambda: "relay-eu" in master.hub.links, "the relay's link")
        assert await loop.step() == []
        [series] = loop.observer.collect([rule], now[0], loop.states.keys())
        assert (series.metric, series.subject, series.points[-1][1]) == (RELAY_DOWN, "relay-eu", 0.0)

        await relay.stop()
        await until(lambda: "relay-eu" not in master.hub.links, "the link to close")
        now[0] += 1
        assert await loop.step() == [] and loop.states[("relay_down", "relay-eu")].phase == "pending"
        now[0] += 119
        assert await loop.step() == []
        now[0] += 1
        [fired] = await loop.step()
        assert (fired.phase, fired.subject, fired.labels) == (FIRING, "relay-eu", {"relay": "relay-eu", "region": "eu-west"})

        relay = relay_for(master, tmp_path, "relay-eu")
        await relay.start()
        await until(lambda: "relay-eu" in master.hub.links, "the relay's link again")
        now[0] += 15
        [resolved] = await loop.step()
        assert (resolved.phase, resolved.subject, resolved.value) == (RESOLVED, "relay-eu", 0.0)
    finally:
        await relay.stop()
        await master.stop()


async def test_a_relay_agents_last_came_through_is_known_after_a_master_restart(tmp_path):
    """An agent's relay is stored with it: a Master that restarts knows the relay before (or without) its link."""
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    master = Master(config)
    await master.start()
    await connect(master, relay_link("relay-old"), "agt-a")
    await master.stop()
    master = Master(config)
    await master.start()
    try:
        now = [time.time()]
        rule = msgspec.structs.replace(shipped("relay_down"), for_s=0.0)
        [fired] = await AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0]).step()
        assert (fired.subject, fired.phase, fired.labels["relay"]) == ("relay-old", FIRING, "relay-old")
    finally:
        await master.stop()


POLICY = """
[[tier]]
name = "fast"
min_fp16_tflops = 700
min_network_mbps = 1000

[[tier]]
name = "any"
"""


async def test_a_host_under_its_hardware_tiers_network_floor_is_alerted_until_its_bandwidth_is_back(tmp_path):
    policy = tmp_path / "tiers.toml"
    policy.write_text(POLICY)
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, tier_policy=str(policy)))
    await master.start()
    try:
        link = relay_link()
        slow = msgspec.structs.replace(HOST, bandwidth_mbps_down=2000.0, bandwidth_mbps_up=400.0)
        fast = msgspec.structs.replace(HOST, bandwidth_mbps_down=2000.0, bandwidth_mbps_up=1500.0)
        await connect(master, link, "agt-h100")  # two H100s, bandwidth not measured yet: tier "fast"
        a100s = gpus(2, prefix="GPU-a100", name="NVIDIA A100-SXM4-80GB")
        await connect(master, link, "agt-a100", a100s)
        master.registry.agents["agt-a100"].host = slow  # slow too, but its A100s earn "any", which has no floor
        rule = shipped("host_bandwidth_below_floor")
        loop = AlertLoop(FleetObserver(master), [rule])
        assert await loop.step() == []

        await connect(master, link, "agt-h100", host=slow)  # measured: 400 Mbit/s up, the slower direction
        assert {g.tier for g in master.registry.gpus_of("agt-h100")} == {"any"}  # kept from "fast" by its network
        [fired] = await loop.step()
        assert (fired.phase, fired.subject, fired.severity) == (FIRING, "agt-h100", "warning")
        gauge = master.metrics.registry.get_sample_value  # the Prometheus side counts it too, by region
        region = master.registry.agents["agt-h100"].region or "none"
        assert gauge("idlegrid_hosts_below_network_floor", {"region": region}) == 1
        assert (fired.labels["bandwidth_mbps"], fired.labels["floor_mbps"], fired.labels["provider"]) == ("400", "1000", "prov")

        await connect(master, link, "agt-h100", host=fast)
        assert {g.tier for g in master.registry.gpus_of("agt-h100")} == {"fast"}
        [resolved] = await loop.step()
        assert (resolved.phase, resolved.subject, resolved.value) == (RESOLVED, "agt-h100", 0.0)
        assert gauge("idlegrid_hosts_below_network_floor", {"region": region}) == 0
        assert [s for s in loop.observer.collect([rule], time.time(), ()) if s.metric == HOST_BANDWIDTH_BELOW_FLOOR] == []
    finally:
        await master.stop()
