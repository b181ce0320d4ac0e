"""Leadership (master/leadership.py) and the fence (master/store/fenced.py), driven tick by tick with fake clocks
on a real SQLite store: two Masters, ``a`` and ``b``, share one file as they would share a MongoDB database."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.errors import ConfigError, Fenced
from management.store import AGGREGATES
from master import store as store_package
from master.leadership import LeaderRole, Leadership, LeaseTiming
from master.records import EventRecord, LeaseRecord
from master.store import open_store
from master.store.base import Store
from master.store.fenced import WRITES, fenced, repo_names

TIMING = LeaseTiming(ttl_s=10.0, renew_s=3.0, margin_s=2.0)
READS = frozenset({"get", "list", "by_key_id", "by_hash", "count_by_state", "latest", "balances", "current"})


@dataclass
class Clocks:
    """Wall and monotonic time, moved by the test only; the wall clock starts far from the monotonic one."""

    wall_now: float = 1_700_000_000.0
    mono_now: float = 500.0

    def wall(self) -> float:
        return self.wall_now

    def mono(self) -> float:
        return self.mono_now

    def advance(self, seconds: float) -> None:
        self.wall_now += seconds
        self.mono_now += seconds


@dataclass
class Told:
    elected: list[LeaseRecord] = field(default_factory=list)
    deposed: list[str] = field(default_factory=list)

    async def on_elected(self, lease: LeaseRecord) -> None:
        self.elected.append(lease)

    async def on_deposed(self, reason: str) -> None:
        self.deposed.append(reason)


def master(store: Store, name: str, clocks: Clocks, told: Told) -> Leadership:
    leadership = Leadership(
        store.leases,
        name,
        timing=TIMING,
        on_elected=told.on_elected,
        on_deposed=told.on_deposed,
        wall=clocks.wall,
        monotonic=clocks.mono,
    )
    leadership.url, leadership.api_url = f"wss://{name}:7100/link", f"http://{name}:7000"
    return leadership


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    url = f"sqlite:///{tmp_path / 'master.db'}"
    a, b = open_store(url), open_store(url)
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


async def test_the_first_master_to_try_leads_and_the_other_stands_by_naming_it(stores: tuple[Store, Store]) -> None:
    clocks, told_a, told_b = Clocks(), Told(), Told()
    a, b = master(stores[0], "a", clocks, told_a), master(stores[1], "b", clocks, told_b)
    await a.step()
    await b.step()
    await a.taken_over()
    assert (a.role, b.role) == (LeaderRole.LEADER, LeaderRole.STANDBY)
    assert [lease.epoch for lease in told_a.elected] == [1] and told_b.elected == []
    assert (b.leader_url(), b.leader_api_url()) == ("wss://a:7100/link", "http://a:7000")
    assert a.leader_url() == ""  # the leader names no other


async def test_a_leader_renewing_on_time_keeps_leading_and_the_standby_never_takes_over(stores: tuple[Store, Store]) -> None:
    clocks, told = Clocks(), Told()
    a, b = master(stores[0], "a", clocks, told), master(stores[1], "b", clocks, Told())
    await a.step()
    for _ in range(10):
        clocks.advance(TIMING.renew_s)
        await a.step()
        await b.step()
        assert a.leads() and b.role is LeaderRole.STANDBY
    assert told.deposed == []


async def test_a_leader_counts_itself_leader_only_until_ttl_minus_margin_after_its_last_renewal(
    stores: tuple[Store, Store],
) -> None:
    clocks = Clocks()
    a = master(stores[0], "a", clocks, Told())
    await a.step()
    clocks.mono_now += TIMING.ttl_s - TIMING.margin_s - 0.01
    assert a.leads()
    a.fence()  # no error: writes go through
    clocks.mono_now += 0.02
    assert not a.leads()
    with pytest.raises(Fenced, match="not the leader"):
        a.fence()


async def test_a_killed_leaders_lease_is_taken_by_the_standby_once_it_lapses_with_the_next_epoch(
    stores: tuple[Store, Store],
) -> None:
    clocks, told_b = Clocks(), Told()
    a, b = master(stores[0], "a", clocks, Told()), master(stores[1], "b", clocks, told_b)
    await a.step()
    await b.step()
    # a is SIGKILLed: it renews no more. b keeps trying every renew period.
    waited = 0.0
    while b.role is LeaderRole.STANDBY:
        clocks.advance(TIMING.renew_s)
        waited += TIMING.renew_s
        await b.step()
    assert TIMING.ttl_s <= waited <= TIMING.ttl_s + TIMING.renew_s
    await b.taken_over()
    assert [lease.epoch for lease in told_b.elected] == [2] and b.leads()


async def test_a_frozen_leader_resumed_after_a_takeover_writes_nothing_and_steps_down(stores: tuple[Store, Store]) -> None:
    clocks, told_a = Clocks(), Told()
    a, b = master(stores[0], "a", clocks, told_a), master(stores[1], "b", clocks, Told())
    fenced_a = fenced(stores[0], a.fence)
    await a.step()
    await fenced_a.events.append(EventRecord(ts=clocks.wall(), kind="test.written", subject="by-a"))
    clocks.advance(TIMING.ttl_s + 5)  # SIGSTOP of a for 15 s
    await b.step()
    assert b.role is LeaderRole.LEADER
    # SIGCONT: whatever a had pending tries to write first, then its loop ticks.
    with pytest.raises(Fenced):
        await fenced_a.events.append(EventRecord(ts=clocks.wall(), kind="test.written", subject="by-a-after"))
    await a.step()
    assert a.role is LeaderRole.STEPPED_DOWN and a.deposed.is_set()
    assert len(told_a.deposed) == 1 and "lapsed" in told_a.deposed[0]
    assert [e.subject for e in await stores[1].events.list()] == ["by-a"]  # nothing of a's after the takeover
    held = await stores[1].leases.current()
    assert held is not None and (held.holder, held.epoch) == ("b", 2)


async def test_a_leader_whose_renewal_is_refused_steps_down(stores: tuple[Store, Store]) -> None:
    clocks, told_a = Clocks(), Told()
    a, b = master(stores[0], "a", clocks, told_a), master(stores[1], "b", clocks, Told())
    await a.step()
    # b's wall clock runs ahead (skew larger than the margin: what docs/ha.md says must not happen) and takes over.
    b_clocks = Clocks(wall_now=clocks.wall_now + TIMING.ttl_s + 1)
    b = master(stores[1], "b", b_clocks, Told())
    await b.step()
    assert b.role is LeaderRole.LEADER
    clocks.advance(TIMING.renew_s)
    await a.step()  # still valid here, but the renewal is refused: epoch moved on
    assert a.role is LeaderRole.STEPPED_DOWN and "refused: b holds it" in told_a.deposed[0]


async def test_a_stepped_down_master_never_leads_again_in_this_process(stores: tuple[Store, Store]) -> None:
    clocks = Clocks()
    a = master(stores[0], "a", clocks, Told())
    await a.step()
    await a.step_down("test")
    await stores[0].leases.release("a", 1)
    await a.step()
    assert a.role is LeaderRole.STEPPED_DOWN and not a.leads()


async def test_a_clean_stop_releases_the_lease_so_the_standby_takes_it_at_once(stores: tuple[Store, Store]) -> None:
    clocks = Clocks()
    a, b = master(stores[0], "a", clocks, Told()), master(stores[1], "b", clocks, Told())
    await a.step()
    await a.stop(release=True)
    await b.step()
    assert b.role is LeaderRole.LEADER and b.lease is not None and b.lease.epoch == 2


async def test_the_leader_keeps_renewing_while_it_takes_over_and_a_failed_take_over_steps_down(
    stores: tuple[Store, Store],
) -> None:
    clocks, loading = Clocks(), asyncio.Event()
    told = Told()

    async def slow_then_failing(lease: LeaseRecord) -> None:
        await loading.wait()  # a store so large its state loads longer than a lease lasts
        raise RuntimeError("the registry could not be read")

    a = Leadership(
        stores[0].leases,
        "a",
        timing=TIMING,
        on_elected=slow_then_failing,
        on_deposed=told.on_deposed,
        wall=clocks.wall,
        monotonic=clocks.mono,
    )
    await a.step()
    for _ in range(5):  # 15 s of loading: renewed all along
        clocks.advance(TIMING.renew_s)
        await a.step()
        assert a.leads()
    loading.set()
    await a.taken_over()
    assert a.role is LeaderRole.STEPPED_DOWN and told.deposed == ["taking over failed: the registry could not be read"]


def test_a_renewal_period_that_cannot_keep_the_lease_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lease_renew_s"):
        LeaseTiming(ttl_s=10.0, renew_s=8.5, margin_s=2.0)


def test_every_repository_method_is_known_as_a_read_or_a_write_so_none_escapes_the_fence() -> None:
    for name in repo_names():
        for backend in (store_package.SqliteStore(":memory:"), store_package.MongoStore("mongodb://127.0.0.1:1/x")):
            repo = type(getattr(backend, name))
            methods = {n for n, _ in inspect.getmembers(repo, inspect.iscoroutinefunction) if not n.startswith("_")}
            unknown = methods - WRITES - READS - {"acquire", "renew", "release"}
            assert not unknown, f"{name}: {sorted(unknown)} are neither reads nor writes in master/store/fenced.py"
    for plugin in AGGREGATES:  # management's own, plugged into the store (an endpoint's keys deleted with it, once missed)
        for made_by in (plugin.sqlite, plugin.mongo):
            methods = {n for n, _ in inspect.getmembers(made_by, inspect.iscoroutinefunction) if not n.startswith("_")}
            unknown = methods - WRITES - READS
            assert not unknown, f"{plugin.name}: {sorted(unknown)} are neither reads nor writes in master/store/fenced.py"


async def test_a_fenced_store_refuses_every_write_of_a_standby_and_lets_reads_through(stores: tuple[Store, Store]) -> None:
    clocks = Clocks()
    a, b = master(stores[0], "a", clocks, Told()), master(stores[1], "b", clocks, Told())
    await a.step()
    await b.step()
    store_b = fenced(stores[1], b.fence)
    with pytest.raises(Fenced):
        await store_b.events.append(EventRecord(ts=1.0, kind="x", subject="y"))
    with pytest.raises(Fenced):
        await store_b.agents.put_many([])
    assert await store_b.events.list() == []
    assert store_b.backend == "sqlite" and (await store_b.leases.current()) is not None
