"""Heartbeats are held in memory and written every heartbeat_flush_s, not with every telemetry flush."""

from __future__ import annotations

import asyncio
import time

import master.upkeep as upkeep
from common.wire import Heartbeat
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import connect, gpus, relay, relay_link


async def stored_last_seen(master: Master) -> float:
    stored = await master.store.agents.get("agt-a")
    assert stored is not None
    return stored.last_seen


async def test_heartbeats_are_written_once_per_heartbeat_flush_not_with_each_rollup_flush(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, rollup_flush_s=0.05, heartbeat_flush_s=0.6)
    master = Master(config)
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a", gpus(1))
        stored_before = await stored_last_seen(master)
        await asyncio.sleep(0.1)  # past the welcome's own write
        await relay(master, link, "agt-a", Heartbeat(seq=1, ts=time.time()))
        seen = master.agent("agt-a").last_seen
        assert seen > stored_before
        await asyncio.sleep(0.25)  # several rollup flushes
        assert await stored_last_seen(master) < seen  # in memory only, so far
        deadline = time.monotonic() + 3
        while await stored_last_seen(master) < seen and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await stored_last_seen(master) == seen  # written by the heartbeat flush
    finally:
        await master.stop()


async def test_a_flush_that_wrote_something_gives_the_c_heaps_free_pages_back(tmp_path, monkeypatch):
    """After a flush wrote rollups or agents, the C heap's free pages go back to the kernel (common/heap.py); a flush
    with nothing to write leaves the heap alone."""
    released: list[float] = []

    def release_free_memory() -> bool:
        released.append(time.monotonic())
        return True

    monkeypatch.setattr(upkeep, "release_free_memory", release_free_memory)
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, rollup_flush_s=0.05, heartbeat_flush_s=0.2)
    master = Master(config)
    await master.start()
    try:
        await asyncio.sleep(0.3)  # flushes with nothing to write
        assert released == []
        link = relay_link()
        await connect(master, link, "agt-a", gpus(1))
        await relay(master, link, "agt-a", Heartbeat(seq=1, ts=time.time()))
        deadline = time.monotonic() + 3
        while not released and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert released  # the heartbeat flush wrote agt-a, then released the heap's free pages
    finally:
        await master.stop()
