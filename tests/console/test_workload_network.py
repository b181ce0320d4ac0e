"""A gang's private network on its workload's page (docs/overlay.md), in Debian's Chromium against a real Master:
each replica's overlay address and, for each peer, whether its host reaches it directly or through a relay.

No overlay runs here (the network itself is tested with real nebula in network namespaces, tests/agent/
test_overlay_netns.py): the Master lists a lighthouse that nothing runs, so it takes the gang and its scheduler gives it
a block as it places it, and the paths are what the hosts' heartbeats left in the registry (master/agent_channel.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from master.overlay import LighthouseSetting, OverlaySettings
from master.port import WorkloadSpec
from master.records import ReplicaSpec
from tests.console.conftest import ConsoleMaster, console_config
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BLOCK = "100.64.0.128/25"  # the first block after the lighthouses'
LIGHTHOUSE = LighthouseSetting(address="100.64.0.1", endpoints=["198.18.0.2:4242"])


@pytest.fixture
def console_master(tmp_path: Path) -> Iterator[ConsoleMaster]:
    """The console's Master with a lighthouse in its [overlay]: one without refuses gangs that want a network."""
    master = ConsoleMaster(msgspec.structs.replace(console_config(tmp_path), overlay=OverlaySettings(lighthouses=[LIGHTHOUSE])))
    master.start()
    yield master
    master.stop()


def test_a_gangs_page_shows_each_replicas_address_and_how_it_reaches_its_peers(console_master, page, sign_in, shot):
    master, services = console_master.server.master, console_master.services

    async def seed() -> str:
        for host in ("agt-one", "agt-two"):
            await add_agent(master, host, "a10:1", provider="acme", runtime="docker", isolation="container")
        spec = WorkloadSpec(name="ddp", image="pytorch", replicas=2, replica=ReplicaSpec(gpus=1))
        record = await services.workloads.submit_workload("rita", spec)
        return record.id

    workload_id = console_master.run(seed())

    async def placed() -> list[str]:  # the scheduler places the gang on both hosts (one GPU each)
        deadline = time.monotonic() + 30
        while len((rec := await services.workloads.get_workload(workload_id)).assignments) < 2:
            assert time.monotonic() < deadline, "the gang was not placed"
            await asyncio.sleep(0.1)
        assert rec.network == BLOCK
        return [a.container for a in sorted(rec.assignments, key=lambda a: a.replica)]

    first, second = console_master.run(placed())
    # What the hosts' last heartbeats said: replica 0 reaches replica 1 directly, replica 1 has said nothing yet.
    master.registry.overlay_paths["agt-one"] = {first: {"100.64.0.130": "direct"}}
    plain = console_master.run(services.workloads.submit_workload("rita", WorkloadSpec(name="solo", image="pytorch")))
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/workloads/{workload_id}")
    section = page.get_by_role("region", name="Private network")
    assert BLOCK in section.inner_text()
    rows = page.locator("#network tbody tr").all_inner_texts()
    assert len(rows) == 2, rows
    assert "100.64.0.129" in rows[0] and "100.64.0.130 direct" in rows[0]
    assert "100.64.0.130" in rows[1] and "not yet" in rows[1]
    shot(page, "gang-network")
    master.registry.overlay_paths["agt-two"] = {second: {"100.64.0.129": "relay"}}
    page.reload()
    assert "100.64.0.129 relay" in page.locator("#network tbody tr").nth(1).inner_text()
    page.goto(f"{console_master.url}/console/workloads/{plain.id}")
    assert page.locator("#network").count() == 0  # a single replica has no private network
