"""Fair-share usage outlives the Master: the scheduling loop loads it from the store before its first cycle, saves it at
most every ``usage_save_every_s`` and when it stops, and a save that fails is logged and made again, never stopping
the loop. A real Master on an SQLite file, driven as in test_loop.py (relay-link handlers, no sockets, simulated
H100s: no GPU is needed); the loops run on their own, on a clock the test moves."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from management.store import fair_share_repo
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop, SchedulerSettings
from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.records import FairShareUsage
from master.store import SqliteStore
from master.store.migrations import SQLITE_MIGRATIONS
from tests.management.workloads.test_runner import host, spec, started

HALF_LIFE_S = 86_400.0
# No cycle on the timer (period_s): cycles run when something wakes the loop, the test's clock moves only when it says.
SETTINGS = SchedulerSettings(half_life_s=HALF_LIFE_S, usage_save_every_s=60.0, period_s=600.0, settle_s=0.0, min_gap_s=0.0)
WAIT_S = 5.0


class Clock:
    """The loops' time, moved by the test, so the GPU-seconds charged are exact."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def running_loop(master: Master, clock: Clock) -> SchedulerLoop:
    book = WorkloadBook(master.store, master, policy=master.policy)
    return SchedulerLoop(master, book, SETTINGS, clock=clock)


def state_of(loop: SchedulerLoop, workload_id: str) -> str | None:
    return next((w.state for w in loop.book.open_workloads() if w.id == workload_id), None)


def creates_sent_for(loop: SchedulerLoop, workload_id: str) -> bool:
    record = next((w for w in loop.book.open_workloads() if w.id == workload_id), None)
    return record is not None and all(a.command_id for a in record.assignments)


async def alice_runs_one_gpu_for_an_hour(master: Master, link: AccessLink, loop: SchedulerLoop, clock: Clock) -> None:
    """alice's workload is placed and runs on agt-a's one GPU, then the clock moves on an hour and a cycle charges it."""
    await host(master, link, "agt-a")
    wl = await loop.book.submit("alice", spec(), clock.now)
    # Placed, and its create sent: the loop stores the placement before it sends the create (a Master killed between
    # them issues it again), so "scheduled" alone may be seen before the create's id is on the record.
    await until(lambda: state_of(loop, wl.id) == "scheduled" and creates_sent_for(loop, wl.id), "the create to be sent")
    await started(master, link, await loop.book.get(wl.id))
    await until(lambda: state_of(loop, wl.id) == "running", "the workload to run")
    clock.now += 3600
    loop.wake()
    await until(lambda: loop.usage.usage.get("alice") == 3600.0, "an hour of one GPU to be charged")


async def test_a_master_started_on_the_store_of_a_stopped_one_goes_on_from_its_usage_decayed(
    tmp_path: Path, link: AccessLink
) -> None:
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    t0 = time.time()
    first = Master(config)
    await first.start()
    try:
        await first.accounts.ensure("alice", AccountRole.RENTER)
        clock = Clock(t0)
        loop = running_loop(first, clock)
        await loop.book.load()
        loop.start()
        await alice_runs_one_gpu_for_an_hour(first, link, loop, clock)
        await until(lambda: loop.usage_saver.saves >= 1, "the usage to be saved, a minute having passed")
        await loop.stop()
    finally:
        await first.stop()
    saved_at = t0 + 3600

    second = Master(config)  # a restart, or another Master taking over the same store
    await second.start()
    try:
        back = Clock(saved_at + HALF_LIFE_S)  # down for one half-life
        again = running_loop(second, back)
        await again.book.load()
        assert again.usage.usage == {}

        again.start()
        await until(lambda: again.usage_saver.loaded, "the saved usage to be loaded")

        assert again.usage.usage == pytest.approx({"alice": 1800.0})
        assert again.usage.project_usage == pytest.approx({("alice", "default"): 1800.0})
        snapshot = await again.snapshot(back.now)  # what the core orders the queue by
        assert snapshot.usage == pytest.approx({"alice": 1800.0})
        await again.stop()  # saves once more: decayed to its own clock
        saved = await fair_share_repo(second.store).list()
        assert [(u.account, u.project, u.decayed_to) for u in saved] == [
            ("alice", None, back.now),
            ("alice", "default", back.now),
        ]
        assert [u.gpu_seconds for u in saved] == pytest.approx([1800.0, 1800.0])
    finally:
        await second.stop()


async def test_a_save_the_store_refuses_is_logged_the_loop_cycles_on_and_the_next_save_writes_it(
    tmp_path: Path, link: AccessLink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="management.scheduler.usage_saving")
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    try:
        await master.accounts.ensure("alice", AccountRole.RENTER)
        assert isinstance(master.store, SqliteStore)
        clock = Clock(time.time())
        loop = running_loop(master, clock)
        await loop.book.load()
        loop.start()
        await until(lambda: loop.usage_saver.loaded, "the (empty) usage to be loaded")
        with sqlite3.connect(master.store.path, isolation_level=None) as outside:  # a store that refuses the write
            outside.execute("DROP TABLE fair_share")
        outside.close()

        await alice_runs_one_gpu_for_an_hour(master, link, loop, clock)
        await until(lambda: caplog.text.count("fair-share usage not saved") == 1, "the failed save to be logged")
        saves = loop.usage_saver.saves
        loop.wake()
        await until(lambda: caplog.text.count("fair-share usage not saved") == 2, "the loop to cycle on, and try again")
        assert loop.usage_saver.saves == saves

        (create_table,) = next(step for step in SQLITE_MIGRATIONS if step.version == 5).statements
        with sqlite3.connect(master.store.path, isolation_level=None) as outside:  # the store is back
            outside.execute(create_table)
        outside.close()
        clock.now += 1
        loop.wake()
        await until(lambda: loop.usage_saver.saves > saves, "the save to be made again")

        saved = {(u.account, u.project): u for u in await fair_share_repo(master.store).list()}
        assert set(saved) == {("alice", None), ("alice", "default")}
        assert saved[("alice", None)].gpu_seconds == pytest.approx(3601.0, abs=0.1)
        assert saved[("alice", None)].decayed_to == clock.now
        await loop.stop()
    finally:
        await master.stop()


async def test_a_loop_that_could_not_load_the_usage_never_overwrites_it_and_adds_it_once_it_can(
    tmp_path: Path, link: AccessLink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="management.scheduler.usage_saving")
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    try:
        await master.accounts.ensure("alice", AccountRole.RENTER)
        assert isinstance(master.store, SqliteStore)
        clock = Clock(time.time())
        await fair_share_repo(master.store).put_many([FairShareUsage(account="alice", gpu_seconds=1000.0, decayed_to=clock.now)])
        with sqlite3.connect(master.store.path, isolation_level=None) as outside:  # the store cannot be read...
            outside.execute("ALTER TABLE fair_share RENAME TO fair_share_away")
        outside.close()
        loop = running_loop(master, clock)
        await loop.book.load()
        loop.start()
        await until(lambda: "fair-share usage not loaded" in caplog.text, "the failed load to be logged")

        await alice_runs_one_gpu_for_an_hour(master, link, loop, clock)
        tries = caplog.text.count("fair-share usage not loaded")
        loop.wake()
        await until(lambda: caplog.text.count("fair-share usage not loaded") > tries, "the load to be tried again, for a save")
        with sqlite3.connect(master.store.path, isolation_level=None) as outside:  # ...and is back, untouched
            assert outside.execute("SELECT key FROM fair_share_away").fetchall() == [("alice",)]
            outside.execute("ALTER TABLE fair_share_away RENAME TO fair_share")
        outside.close()
        assert loop.usage_saver.saves == 0 and not loop.usage_saver.loaded

        clock.now += 1
        loop.wake()
        await until(lambda: loop.usage_saver.saves == 1, "the usage to be loaded and saved")

        hour = 3600.0 * 0.5 ** (1 / HALF_LIFE_S) + 1.0  # what this loop charged, decayed to its clock
        stored = 1000.0 * 0.5 ** (3601 / HALF_LIFE_S)  # what was saved before, decayed to the same clock
        assert loop.usage.usage == pytest.approx({"alice": hour + stored})
        saved = {(u.account, u.project): u.gpu_seconds for u in await fair_share_repo(master.store).list()}
        assert saved == pytest.approx({("alice", None): hour + stored, ("alice", "default"): hour})
        await loop.stop()
    finally:
        await master.stop()
