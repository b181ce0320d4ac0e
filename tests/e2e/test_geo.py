"""Issue 3, acceptance 1: agents find the nearest relay through DNS, fail over to another region, and come home.

A real dnsmasq serves two regions under ``idlegrid.test``: region ``a`` with relay-a1 and relay-a2, region ``b``
with relay-b1, each region naming the other as its fallback (TXT). Every relay is a real Access process on
127.0.0.1 whose certificate carries its SRV target name, and every agent a real agent process that knows only
the domain, its region and the nameserver.

Why relay-a1 is "best" in region a: on loopback both relays answer the TCP probe in well under a millisecond,
the same latency bucket, so the measured latency cannot tell them apart honestly. The SRV priority does
(relay-a1 10, relay-a2 20), and the ranking always respects priority before latency (agent/discovery.py;
ranking by latency is covered with scripted latencies in tests/agent/test_discovery.py).

Coming home: the DNS TTL (60 s) is longer than the test, so no re-resolve happens by expiry. Once region a's
relays are back, agents stay on relay-b1 (a connected agent does not flap); the test then kills relay-b1, and
on that reconnect the agents, being away from home, resolve afresh and pick relay-a1 again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import fallback_name, srv_name
from tests.support.dnsmasq import Dnsmasq, HostRecord, Record, SrvRecord, TxtRecord
from tests.support.grid import Grid, RelayInfo, wait_for

ZONE = "idlegrid.test"
DNS_TTL_S = 60
RELAYS = {"relay-a1": ("a", 10), "relay-a2": ("a", 20), "relay-b1": ("b", 10)}  # id -> (region, SRV priority)
FALLBACK = {"a": "b", "b": "a"}
AGENTS = {"geo-a-0": "a", "geo-a-1": "a", "geo-b-0": "b"}
SWITCH_TIMEOUT_S = 20.0


def relay_host(relay_id: str) -> str:
    return f"{relay_id}.{ZONE}"


def zone_records(relays: dict[str, RelayInfo]) -> list[Record]:
    records: list[Record] = []
    for relay_id, (region, priority) in RELAYS.items():
        host = relay_host(relay_id)
        records += [
            SrvRecord(srv_name(region, ZONE).rstrip("."), host, relays[relay_id].agent_port, priority, 10),
            HostRecord(host, "127.0.0.1", DNS_TTL_S),
        ]
    records += [TxtRecord(fallback_name(region, ZONE).rstrip("."), f"regions={other}") for region, other in FALLBACK.items()]
    return records


@pytest.fixture
def geo(tmp_path: Path) -> Iterator[tuple[Grid, Dnsmasq]]:
    grid = Grid(tmp_path)
    try:
        grid.start_master()
        for relay_id, (region, _) in RELAYS.items():
            grid.start_relay(relay_id, region, names=[relay_host(relay_id)])
        with Dnsmasq(ZONE, local_ttl=DNS_TTL_S, workdir=tmp_path / "dnsmasq").start(zone_records(grid.relays)) as dns:
            yield grid, dns
    finally:
        grid.stop()


def start_agents(grid: Grid, dns: Dnsmasq) -> dict[str, str]:
    """Enroll and start every agent in DNS mode; returns agent id -> home region."""
    ids = {}
    for name, region in AGENTS.items():
        enrolled = grid.enroll(name, grid.relays["relay-b1"], region=region)
        assert enrolled.returncode == 0, enrolled.stderr
        ids[grid.agent_id(name)] = region
    for name, region in AGENTS.items():
        grid.start_agent(
            name,
            "--region",
            region,
            "--dns-domain",
            ZONE,
            "--dns-nameserver",
            dns.address,
            "--dns-port",
            str(dns.port),
            simulate="l4:1",
        )
    return ids


def placement(grid: Grid, ids: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """agent id -> (state, region, relay), as the operator API shows them."""
    return {a["id"]: (a["state"], a["region"], a["relay"]) for a in grid.get("/api/v1/agents")["items"] if a["id"] in ids}


def wait_placed(grid: Grid, ids: dict[str, str], relay_of_region: dict[str, str], what: str) -> None:
    want = {agent_id: ("ready", region, relay_of_region[region]) for agent_id, region in ids.items()}
    relay_b1 = grid.relays["relay-b1"].daemon
    assert relay_b1 is not None
    wait_for(
        lambda: placement(grid, ids) == want,
        SWITCH_TIMEOUT_S,
        f"{what}: want {want}\nrelay-b1 log:\n{relay_b1.tail(10)}",
    )


def relay_changes(grid: Grid) -> list[tuple[str, str, str, str]]:
    events = grid.get("/api/v1/events?kind=agent.relay_changed")["items"]
    return [(e["subject"], e["data"]["old_relay"], e["data"]["new_relay"], e["data"]["region"]) for e in events]


def kill(grid: Grid, *relay_ids: str) -> None:
    for relay_id in relay_ids:
        daemon = grid.relays[relay_id].daemon
        assert daemon is not None
        daemon.kill()


def test_agents_use_their_regions_best_relay_fail_over_to_the_fallback_region_and_come_home(geo):
    grid, dns = geo
    ids = start_agents(grid, dns)
    a_agents = [agent_id for agent_id, region in ids.items() if region == "a"]
    b_agent = next(agent_id for agent_id, region in ids.items() if region == "b")

    wait_placed(grid, ids, {"a": "relay-a1", "b": "relay-b1"}, "each agent on its region's best relay")
    assert relay_changes(grid) == []

    kill(grid, "relay-a2", "relay-a1")  # the idle one first, so no agent can land on it in between
    wait_placed(grid, ids, {"a": "relay-b1", "b": "relay-b1"}, "region a's agents on region b's relay")
    assert sorted(relay_changes(grid)) == sorted((a, "relay-a1", "relay-b1", "a") for a in a_agents)

    for relay_id in ("relay-a1", "relay-a2"):
        grid.start_relay(relay_id, "a", names=[relay_host(relay_id)])
    assert placement(grid, ids) == {agent_id: ("ready", region, "relay-b1") for agent_id, region in ids.items()}

    kill(grid, "relay-b1")  # the next reconnect: region a's agents go home, region b's agent falls back to a
    wait_placed(grid, ids, {"a": "relay-a1", "b": "relay-a1"}, "everyone on relay-a1")
    home_again = [c for c in relay_changes(grid) if c[1] == "relay-b1"]
    assert sorted(home_again) == sorted(
        [(a, "relay-b1", "relay-a1", "a") for a in a_agents] + [(b_agent, "relay-b1", "relay-a1", "b")]
    )
