"""A gang's private network as the scheduling loop hands it out (docs/overlay.md): a real Master (SQLite in tmp_path)
with lighthouses configured, hosts that send their overlay key in hello, creates carrying each replica's place on the
network, signed for its host's key. No GPU is needed: the agents report simulated H100s."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from common.inventory import Inventory
from common.nebula import decode_cert_pem, fingerprint, new_host_key, public_key_of_pem, verify
from common.overlay import OverlaySpec
from common.wire import PROTOCOL_VERSIONS, AgentConnected, Heartbeat, Hello
from management.views.workloads import network_view
from management.workloads.runner import SchedulerLoop
from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.overlay import LighthouseSetting, OverlaySettings
from tests.management.workloads.test_runner import creates_sent, deleted, scheduler, spec, started
from tests.master.linked import HOST, enrolled, gpus, relay, relay_link

LIGHTHOUSES = [LighthouseSetting(address="100.64.0.1", endpoints=["relay-eu.example:4242"])]


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0, overlay=OverlaySettings(lighthouses=LIGHTHOUSES))
    m = Master(config)
    await m.start()
    await m.accounts.ensure("alice", AccountRole.RENTER)
    yield m
    await m.stop()


@pytest.fixture
def link() -> AccessLink:
    return relay_link()


async def host_with_key(master: Master, link: AccessLink, agent_id: str) -> str:
    """A host with one simulated H100 that can run the overlay: returns the public key it sent."""
    _, public = new_host_key()
    await enrolled(master, agent_id)
    link.agents.add(agent_id)
    master.hub.links.setdefault(link.relay_id, link)
    await master.channel.on_link_frame(link, AgentConnected(agent_id=agent_id, serial="", cert_not_after=time.time() + 3600))
    inventory = Inventory(
        host=HOST,
        gpus=gpus(1, prefix=f"GPU-{agent_id}"),
        simulated=True,
        runtime="docker",
        isolation="container",
        overlay_key=public,
    )
    await relay(master, link, agent_id, Hello(versions=list(PROTOCOL_VERSIONS), agent_version="test", inventory=inventory))
    return public


def overlay_of(link: AccessLink, agent_id: str) -> OverlaySpec:
    (command,) = creates_sent(link, agent_id)[-1:]
    return msgspec.convert(command.body.spec["overlay"], OverlaySpec)


async def test_each_replica_of_a_gang_gets_its_address_rank_and_a_certificate_for_its_hosts_key(
    master: Master, link: AccessLink
) -> None:
    keys = {agent: await host_with_key(master, link, agent) for agent in ("agt-a", "agt-b")}
    loop: SchedulerLoop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.network == "100.64.0.128/25"
    for a in rec.assignments:
        overlay = overlay_of(link, a.agent_id)
        assert overlay.rank == a.replica and overlay.peers == ["100.64.0.129", "100.64.0.130"]
        assert overlay.group == wl.id and overlay.lighthouses[0].endpoints == ["relay-eu.example:4242"]
        cert = decode_cert_pem(overlay.certificate)
        assert verify(cert, master.overlay.ca) and cert.groups == (wl.id,)
        assert cert.public_key == public_key_of_pem(keys[a.agent_id])  # the host's own key: no private key travels


async def test_a_second_gang_gets_another_block_and_a_single_replica_none(master: Master, link: AccessLink) -> None:
    for agent in ("agt-a", "agt-b", "agt-c", "agt-d", "agt-e"):
        await host_with_key(master, link, agent)
    loop = scheduler(master)
    await loop.book.load()
    first = await loop.book.submit("alice", spec("one", replicas=2), time.time())
    second = await loop.book.submit("alice", spec("two", replicas=2), time.time())
    single = await loop.book.submit("alice", spec("three"), time.time())
    await loop.cycle()
    networks = {(await loop.book.get(w.id)).network for w in (first, second)}
    assert networks == {"100.64.0.128/25", "100.64.1.0/25"}
    rec = await loop.book.get(single.id)
    assert rec.network == "" and "overlay" not in creates_sent(link, rec.assignments[0].agent_id)[0].body.spec


async def test_a_gang_that_asks_for_no_network_gets_none_where_the_overlay_runs(master: Master, link: AccessLink) -> None:
    for agent in ("agt-a", "agt-b"):
        await host_with_key(master, link, agent)
    loop = scheduler(master)
    await loop.book.load()
    apart = await loop.book.submit("alice", spec("apart", replicas=2, network="none"), time.time())
    await loop.cycle()
    rec = await loop.book.get(apart.id)
    assert rec.state == "scheduled" and rec.network == ""
    assert all("overlay" not in creates_sent(link, a.agent_id)[0].body.spec for a in rec.assignments)


async def test_a_restarted_gang_keeps_its_block_ranks_and_addresses(master: Master, link: AccessLink) -> None:
    for agent in ("agt-a", "agt-b"):
        await host_with_key(master, link, agent)
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2, restart_policy="on_failure", max_restarts=2), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    before = {a.replica: overlay_of(link, a.agent_id) for a in rec.assignments}
    await started(master, link, rec)
    await loop.cycle()
    rec = await loop.book.end(wl.id, "requeue", "test: a restart", time.time(), grace_s=0.0)
    assert rec.state == "queued" and rec.network == "100.64.0.128/25"
    # Its old containers go; then it is placed again (a new attempt) with the same network.
    for agent in ("agt-a", "agt-b"):
        await deleted(master, link, agent)
    for _ in range(3):
        await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.attempts == 2 and rec.network == "100.64.0.128/25"
    for a in rec.assignments:
        after = overlay_of(link, a.agent_id)
        assert (after.rank, after.peers) == (before[a.replica].rank, before[a.replica].peers)


async def test_the_workload_shows_each_replicas_address_and_whether_its_peers_are_direct_or_relayed(
    master: Master, link: AccessLink
) -> None:
    for agent in ("agt-a", "agt-b"):
        await host_with_key(master, link, agent)
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    r0, r1 = sorted(rec.assignments, key=lambda a: a.replica)
    # The agents' heartbeats say how their overlay clients reach the peer (agent/overlay.py reads it from nebula).
    for a, peer, path in ((r0, "100.64.0.130", "relay"), (r1, "100.64.0.129", "relay")):
        beat = Heartbeat(seq=1, ts=time.time(), running=[a.container], overlay={a.container: {peer: path}})
        await relay(master, link, a.agent_id, beat)
    paths = {a.replica: master.overlay_paths(a.agent_id, a.container) for a in rec.assignments}
    view = network_view(rec, paths)
    assert view.network == "100.64.0.128/25"
    assert [(r.replica, r.address, r.peers) for r in view.replicas] == [
        (0, "100.64.0.129", {"100.64.0.130": "relay"}),
        (1, "100.64.0.130", {"100.64.0.129": "relay"}),
    ]


async def test_a_gang_whose_host_is_lost_is_requeued_whole_and_its_replica_moves_with_its_address(
    master: Master, link: AccessLink
) -> None:
    keys = {agent: await host_with_key(master, link, agent) for agent in ("agt-a", "agt-b", "agt-c")}
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2, restart_policy="on_failure", max_restarts=2), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    await started(master, link, rec)
    await loop.cycle()
    assert (await loop.book.get(wl.id)).state == "running"
    by_replica = {a.replica: a.agent_id for a in rec.assignments}
    first = {a.replica: overlay_of(link, a.agent_id) for a in rec.assignments}
    assert all(o.blocklist == [] for o in first.values())  # nothing issued before
    lost = by_replica[1]
    await master.revoke(lost, "test: the host is gone")  # its replica cannot come back from it
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.state == "queued" and rec.network == "100.64.0.128/25"  # the whole gang, its block kept
    await deleted(master, link, by_replica[0])  # the surviving replica's container is stopped
    for _ in range(3):
        await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.state == "scheduled" and rec.attempts == 2
    moved = next(a for a in rec.assignments if a.replica == 1)
    assert moved.agent_id not in (lost,)
    overlay = overlay_of(link, moved.agent_id)
    assert overlay.rank == 1 and overlay.peers == ["100.64.0.129", "100.64.0.130"]  # same rank, same address
    cert = decode_cert_pem(overlay.certificate)
    assert cert.public_key == public_key_of_pem(keys[moved.agent_id])  # a new certificate, for its new host's key
    # Every new replica's Nebula refuses the first attempt's certificates that no current container holds: the one
    # left on the lost host, still valid, names replica 1's address and must not take it back from its successor.
    # (Replica 0 placed again on its host within the same second gets the very same certificate: it stays allowed.)
    current = {fingerprint(decode_cert_pem(overlay_of(link, a.agent_id).certificate)).hex() for a in rec.assignments}
    old = {r: fingerprint(decode_cert_pem(o.certificate)).hex() for r, o in first.items()}
    for a in rec.assignments:
        blocklist = overlay_of(link, a.agent_id).blocklist
        assert old[1] in blocklist and set(blocklist) == set(old.values()) - current == set(old.values()), (blocklist, old)
        assert a.overlay_fingerprint == fingerprint(decode_cert_pem(overlay_of(link, a.agent_id).certificate)).hex()
