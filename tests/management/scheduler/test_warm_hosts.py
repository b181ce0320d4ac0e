"""Warm hosts (docs/endpoints.md, "The autoscaler's shell"): an endpoint's worker goes, among the hosts that fit it at
the same price, to one that already holds its image (no pull: the shortest cold start); an ordinary workload is placed
as before, and a cheaper host still wins over a warm one."""

from __future__ import annotations

from common.inventory import ImageSource
from management.scheduler import Host, Job, ReplicaRequest, schedule
from tests.management.scheduler.grid import gpus, grid, placed, snapshot

IMAGE = "ghcr.io/acme/echo:1"


def worker(jid: str, *, prefer_warm: bool = True) -> Job:
    return Job(jid, "acme", request=ReplicaRequest(gpus=1), image=IMAGE, prefer_warm=prefer_warm)


def engine(hid: str, images: tuple[str, ...] = (), price: int = 0) -> Host:
    return Host(hid, runtime="docker", image_source=ImageSource(), images=images, price=price)


def test_an_endpoint_worker_goes_to_the_host_that_holds_its_image_where_bin_packing_would_go_elsewhere():
    # Bin-packing puts one GPU on the host with the fewest idle ones ("packed"); the warm host has two.
    hosts, units = grid(
        [engine("packed"), engine("warm", ("docker.io/library/busybox:latest", IMAGE))], units=gpus("packed", 1) + gpus("warm", 2)
    )
    assert placed(schedule(snapshot(hosts, units, queue=[worker("w")])))["w"] == (("warm-g0",),)
    # The same job as an ordinary workload is bin-packed, as before.
    assert placed(schedule(snapshot(hosts, units, queue=[worker("w", prefer_warm=False)])))["w"] == (("packed-g0",),)


def test_the_image_is_matched_under_any_spelling_of_its_name():
    hosts, units = grid([engine("packed"), engine("warm", ("ghcr.io/acme/echo:1",))], units=gpus("packed", 1) + gpus("warm", 2))
    job = Job("w", "acme", request=ReplicaRequest(gpus=1), image="GHCR.io/acme/echo:1", prefer_warm=True)
    assert placed(schedule(snapshot(hosts, units, queue=[job])))["w"] == (("warm-g0",),)


def test_a_cheaper_cold_host_wins_over_a_warm_one():
    hosts, units = grid(
        [engine("cheap", price=1_000_000), engine("warm", (IMAGE,), price=2_000_000)], units=gpus("cheap", 1) + gpus("warm", 1)
    )
    assert placed(schedule(snapshot(hosts, units, queue=[worker("w")])))["w"] == (("cheap-g0",),)


def test_a_warm_host_that_is_full_leaves_the_worker_to_a_cold_one():
    hosts, units = grid([engine("cold"), engine("warm", (IMAGE,))], units=gpus("cold", 1) + gpus("warm", 1))
    busy = snapshot(hosts, units, queue=[worker("w")], extra_holders={"warm-g0": "other"})
    assert placed(schedule(busy))["w"] == (("cold-g0",),)
