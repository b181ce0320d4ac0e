"""Relay discovery: SRV and TXT records served by a real dnsmasq, relays played by real TCP listeners on 127.0.0.1.

Latency between listeners on one machine is the same for all, so most tests inject a probe that first makes
the real TCP connect (a closed relay fails for real) and then reports a latency chosen by the test.
One test uses the real default probe.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.discovery import (
    DiscoveryConfig,
    DiscoveryError,
    Probe,
    RelayCandidate,
    RelayDiscovery,
    demote,
    fallback_name,
    parse_fallback,
    rank,
    srv_name,
    tcp_connect_latency,
)
from common.errors import ConfigError
from tests.support.dnsmasq import Dnsmasq, HostRecord, Record, SrvRecord, TxtRecord
from tests.support.grid import free_port

ZONE = "idlegrid.test"
RELAY_TTL_S = 30  # --local-ttl: the TTL of SRV and TXT answers
HOST_TTL_S = 60

# region -> relay -> (SRV priority, SRV weight)
LAYOUT: dict[str, dict[str, tuple[int, int]]] = {
    "a": {"a1": (10, 10), "a2": (10, 10), "a3": (20, 10)},
    "b": {"b1": (10, 10), "b2": (10, 10)},
    "c": {"c1": (10, 10)},
}
FALLBACK_OF_A = "regions=b,c"
LATENCY_MS = {"a1": 40.0, "a2": 12.0, "a3": 1.0, "b1": 30.0, "b2": 20.0, "c1": 2.0}


class Relay:
    """A TCP listener standing in for an Access relay: it accepts and hangs up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def host(self) -> str:
        return f"{self.name}.{ZONE}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hang_up, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]  # kept, so a restarted relay matches its SRV record

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    @staticmethod
    async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()


class Clock:
    """A monotonic clock the test moves by hand, so TTL expiry is tested without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def records_for(relays: dict[str, Relay], *, fallback: str = FALLBACK_OF_A, host_ttl: int = HOST_TTL_S) -> list[Record]:
    records: list[Record] = []
    for region, members in LAYOUT.items():
        for name, (priority, weight) in members.items():
            relay = relays[name]
            records.append(SrvRecord(srv_name(region, ZONE).rstrip("."), relay.host, relay.port, priority, weight))
            records.append(HostRecord(relay.host, "127.0.0.1", host_ttl))
    records.append(TxtRecord(fallback_name("a", ZONE).rstrip("."), fallback))
    return records


def scripted_probe(latency_ms: dict[str, float]) -> Callable[[RelayCandidate], Awaitable[float]]:
    async def probe(candidate: RelayCandidate) -> float:
        await tcp_connect_latency(candidate)  # a closed relay fails here, for real
        return latency_ms[label(candidate)]

    return probe


def label(candidate: RelayCandidate) -> str:
    return candidate.host.split(".")[0]


def labels(candidates: Sequence[RelayCandidate]) -> list[str]:
    return [label(c) for c in candidates]


@asynccontextmanager
async def running_relays(names: Iterable[str]) -> AsyncIterator[dict[str, Relay]]:
    """A listening ``Relay`` per name, all closed at the end."""
    started = {name: Relay(name) for name in names}
    try:
        for relay in started.values():
            await relay.start()
        yield started
    finally:
        for relay in started.values():
            await relay.close()


@pytest.fixture
async def relays() -> AsyncIterator[dict[str, Relay]]:
    async with running_relays(name for members in LAYOUT.values() for name in members) as started:
        yield started


@pytest.fixture
def dns_server(tmp_path: Path, relays: dict[str, Relay]) -> Iterator[Dnsmasq]:
    with Dnsmasq(ZONE, local_ttl=RELAY_TTL_S, workdir=tmp_path / "dnsmasq").start(records_for(relays)) as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    return Clock()


def discovery_of(
    server: Dnsmasq,
    *,
    region: str = "a",
    probe: Callable[[RelayCandidate], Awaitable[float]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    **settings: float,
) -> RelayDiscovery:
    settings = {"timeout_s": 1.0, "probe_timeout_s": 1.0, **settings}
    config = DiscoveryConfig(
        domain=ZONE,
        region=region,
        nameservers=[server.address],
        port=server.port,
        **settings,
    )
    return RelayDiscovery(config, probe=probe or scripted_probe(LATENCY_MS), clock=clock)


# --- resolving ------------------------------------------------------------------------------------------------


async def test_resolve_reads_a_regions_srv_candidates_and_its_fallback_regions(dns_server, relays):
    candidates, fallbacks = await discovery_of(dns_server).resolve("a")

    assert sorted(candidates, key=label) == [
        RelayCandidate(f"{name}.{ZONE}", relays[name].port, "a", priority, weight, float(RELAY_TTL_S), ("127.0.0.1",))
        for name, (priority, weight) in sorted(LAYOUT["a"].items())
    ]
    assert fallbacks == ["b", "c"]
    assert candidates[0].url == f"wss://{candidates[0].host}:{candidates[0].port}"


async def test_resolve_of_a_region_without_fallback_record_gives_no_fallbacks(dns_server):
    candidates, fallbacks = await discovery_of(dns_server).resolve("b")

    assert sorted(labels(candidates)) == ["b1", "b2"]
    assert fallbacks == []


async def test_resolve_of_a_region_without_records_is_empty(dns_server):
    assert await discovery_of(dns_server).resolve("nowhere") == ([], [])


async def test_a_candidate_lives_no_longer_than_its_address_record(tmp_path, relays):
    with Dnsmasq(ZONE, local_ttl=RELAY_TTL_S, workdir=tmp_path / "d").start(records_for(relays, host_ttl=7)) as server:
        candidates, _ = await discovery_of(server).resolve("a")

    assert {c.ttl for c in candidates} == {7.0}


async def test_an_srv_target_of_dot_means_no_service_and_is_skipped(tmp_path, relays):
    records = [SrvRecord(srv_name("a", ZONE).rstrip("."), ".", 0), *records_for(relays)]
    with Dnsmasq(ZONE, workdir=tmp_path / "d").start(records) as server:
        candidates, _ = await discovery_of(server).resolve("a")

    assert sorted(labels(candidates)) == ["a1", "a2", "a3"]


# --- ranking --------------------------------------------------------------------------------------------------


async def test_the_agents_region_comes_lowest_latency_first_and_priority_is_respected(dns_server):
    ranked = await discovery_of(dns_server).ranked()

    # a3 is the fastest, but its priority (20) comes after a1's and a2's (10)
    assert labels(ranked) == ["a2", "a1", "a3"]


async def test_dead_relays_of_the_region_are_dropped(dns_server, relays):
    await relays["a2"].close()

    assert labels(await discovery_of(dns_server).ranked()) == ["a1", "a3"]


async def test_with_every_relay_of_the_region_down_the_fallback_regions_follow_in_txt_order(dns_server, relays):
    for name in LAYOUT["a"]:
        await relays[name].close()

    ranked = await discovery_of(dns_server).ranked()

    # c1 is faster than b's relays, but the TXT record says b before c
    assert labels(ranked) == ["b2", "b1", "c1"]
    assert {c.region for c in ranked} == {"b", "c"}


async def test_the_region_is_preferred_again_once_it_recovers_and_the_cache_expires(dns_server, relays, clock):
    discovery = discovery_of(dns_server, clock=clock)
    for name in LAYOUT["a"]:
        await relays[name].close()
    assert labels(await discovery.ranked()) == ["b2", "b1", "c1"]

    for name in LAYOUT["a"]:
        await relays[name].start()
    clock.advance(RELAY_TTL_S - 1)
    assert labels(await discovery.ranked()) == ["b2", "b1", "c1"]  # still cached

    clock.advance(1)
    assert discovery.expired()
    assert labels(await discovery.ranked()) == ["a2", "a1", "a3"]


async def test_force_resolves_again_before_the_cache_expires(dns_server, relays, clock):
    discovery = discovery_of(dns_server, clock=clock)
    await relays["a2"].close()
    assert labels(await discovery.ranked()) == ["a1", "a3"]

    await relays["a2"].start()

    assert labels(await discovery.ranked()) == ["a1", "a3"]
    assert labels(await discovery.ranked(force=True)) == ["a2", "a1", "a3"]


async def test_a_relay_marked_failed_goes_to_the_back_until_the_next_resolve(dns_server):
    discovery = discovery_of(dns_server)
    a2, a1, a3 = await discovery.ranked()

    discovery.mark_failed(a2)
    assert labels(await discovery.ranked()) == ["a1", "a3", "a2"]
    discovery.mark_failed(a1)
    assert labels(await discovery.ranked()) == ["a3", "a2", "a1"]

    assert labels(await discovery.ranked(force=True)) == ["a2", "a1", "a3"]


async def test_new_records_are_seen_after_the_zone_changes(dns_server, relays):
    discovery = discovery_of(dns_server)
    assert labels(await discovery.ranked()) == ["a2", "a1", "a3"]

    only_a3 = [r for r in records_for(relays) if not (isinstance(r, SrvRecord) and r.target.startswith(("a1", "a2")))]
    dns_server.replace(only_a3)

    assert labels(await discovery.ranked(force=True)) == ["a3"]


async def test_concurrent_callers_share_one_resolve(dns_server):
    probed: list[str] = []

    async def counting_probe(candidate: RelayCandidate) -> float:
        probed.append(label(candidate))
        return LATENCY_MS[label(candidate)]

    discovery = discovery_of(dns_server, probe=counting_probe)
    first, second = await asyncio.gather(discovery.ranked(), discovery.ranked())

    assert first == second
    assert sorted(probed) == ["a1", "a2", "a3"]


async def test_a_probe_slower_than_the_probe_timeout_counts_as_dead(dns_server):
    async def slow_for_a1(candidate: RelayCandidate) -> float:
        if label(candidate) == "a1":
            await asyncio.sleep(10)
        return LATENCY_MS[label(candidate)]

    discovery = discovery_of(dns_server, probe=slow_for_a1, probe_timeout_s=0.2)
    candidates, _ = await discovery.resolve("a")
    probes = {label(p.candidate): p for p in await discovery.probe_all(candidates)}

    assert probes["a1"].latency_ms is None and "0.2s" in probes["a1"].error
    assert labels(await discovery.ranked()) == ["a2", "a3"]


async def test_the_default_probe_times_a_tcp_connect_and_finds_closed_relays_dead(dns_server, relays):
    await relays["a1"].close()
    discovery = RelayDiscovery(DiscoveryConfig(domain=ZONE, region="a", nameservers=[dns_server.address], port=dns_server.port))

    candidates, _ = await discovery.resolve("a")
    probes = {label(p.candidate): p for p in await discovery.probe_all(candidates)}

    assert probes["a1"].latency_ms is None and "ConnectionRefused" in probes["a1"].error
    a2, a3 = probes["a2"].latency_ms, probes["a3"].latency_ms
    assert a2 is not None and a3 is not None and 0 <= a2 < 1000 and 0 <= a3 < 1000
    assert sorted(labels(await discovery.ranked())) == ["a2", "a3"]


# --- TTLs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record_ttl", "expected_s"),
    [(RELAY_TTL_S, RELAY_TTL_S), (1, 5.0), (900, 300.0)],
    ids=["honoured", "raised-to-min", "lowered-to-max"],
)
async def test_the_ranking_lives_for_the_smallest_ttl_clamped(tmp_path, relays, clock, record_ttl, expected_s):
    records = records_for(relays, host_ttl=record_ttl)
    with Dnsmasq(ZONE, local_ttl=record_ttl, workdir=tmp_path / "d").start(records) as server:
        discovery = discovery_of(server, clock=clock, min_ttl_s=5.0, max_ttl_s=300.0)
        await discovery.ranked()

        clock.advance(expected_s - 0.01)
        assert not discovery.expired()
        clock.advance(0.01)
        assert discovery.expired()


async def test_the_fallback_records_ttl_bounds_the_ranking_too(tmp_path, relays, clock):
    # dnsmasq gives SRV and TXT the same --local-ttl, so the shorter TTL is put on the addresses of b and c only
    records: list[Record] = [r for r in records_for(relays) if not isinstance(r, HostRecord)]
    records += [HostRecord(relays[n].host, "127.0.0.1", 60 if n.startswith("a") else 8) for n in LATENCY_MS]
    with Dnsmasq(ZONE, local_ttl=RELAY_TTL_S, workdir=tmp_path / "d").start(records) as server:
        discovery = discovery_of(server, clock=clock)
        assert labels(await discovery.ranked()) == ["a2", "a1", "a3"]
        clock.advance(RELAY_TTL_S)
        for name in LAYOUT["a"]:
            await relays[name].close()
        assert labels(await discovery.ranked()) == ["b2", "b1", "c1"]

        clock.advance(7.99)
        assert not discovery.expired()
        clock.advance(0.01)
        assert discovery.expired()


async def test_an_empty_ranking_is_not_cached(dns_server, relays):
    for relay in relays.values():
        await relay.close()
    discovery = discovery_of(dns_server)

    assert await discovery.ranked() == []
    assert discovery.expired()


# --- DNS failures ---------------------------------------------------------------------------------------------


async def test_a_nameserver_that_does_not_answer_gives_a_clear_error_quickly():
    port = free_port()  # nothing listens there
    discovery = RelayDiscovery(DiscoveryConfig(domain=ZONE, region="a", nameservers=["127.0.0.1"], port=port, timeout_s=0.5))

    started = time.monotonic()
    with pytest.raises(DiscoveryError) as caught:
        await discovery.ranked()

    # Behaviour, not speed: the lookup gives up at its 0.5 s timeout rather than the resolver's default retries
    # (several seconds); 2 s is four times the timeout, room for a loaded machine.
    assert time.monotonic() - started < 2.0
    assert caught.value.code == "discovery_failed"
    message = str(caught.value)
    assert "timed out" in message and "127.0.0.1" in message and str(port) in message
    assert f"_idlegrid._tcp.a.{ZONE}" in message or f"_idlegrid-fallback.a.{ZONE}" in message


async def test_a_nameserver_refusing_the_zone_gives_a_clear_error(dns_server):
    discovery = RelayDiscovery(
        DiscoveryConfig(domain="elsewhere.test", region="a", nameservers=[dns_server.address], port=dns_server.port)
    )

    with pytest.raises(DiscoveryError, match=r"(?s)elsewhere\.test.*REFUSED") as caught:
        await discovery.resolve("a")

    assert f"127.0.0.1 port {dns_server.port}" in str(caught.value)


async def test_the_cached_ranking_survives_dns_going_away_until_a_forced_resolve(dns_server):
    discovery = discovery_of(dns_server)
    ranked = await discovery.ranked()

    dns_server.stop()

    assert await discovery.ranked() == ranked
    with pytest.raises(DiscoveryError):
        await discovery.ranked(force=True)


def test_a_config_with_inverted_ttl_bounds_is_refused():
    with pytest.raises(ConfigError):
        DiscoveryConfig(domain=ZONE, region="a", min_ttl_s=10, max_ttl_s=5)


# --- the pure parts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strings", "expected"),
    [
        ([b"regions=us-east,ap-south"], ["us-east", "ap-south"]),
        ([b"regions=us-ea", b"st,ap-south"], ["us-east", "ap-south"]),  # split at 255 bytes, concatenated back
        ([b"v=1 regions=b, c"], ["b"]),  # whitespace separates fields: " c" is not part of regions
        ([b"regions=B,a,b,Not_Valid,,c"], ["b", "c"]),  # own region, duplicates, bad names dropped
        ([b"other=x"], []),
    ],
)
def test_the_fallback_txt_value_is_parsed(strings, expected):
    assert parse_fallback(strings, own_region="a") == expected


def candidate(name: str, priority: int = 10, weight: int = 10) -> RelayCandidate:
    return RelayCandidate(f"{name}.{ZONE}", 443, "a", priority, weight, 60.0)


def test_equal_priority_and_latency_are_ordered_by_weight_heaviest_first_without_rng():
    probes = [
        Probe(candidate("light", weight=1), 5.0),
        Probe(candidate("none", weight=0), 5.0),
        Probe(candidate("heavy", weight=9), 5.0),
    ]

    assert labels(rank(probes)) == ["heavy", "light", "none"]


def test_with_an_rng_equal_relays_are_picked_in_proportion_to_weight():
    rng = random.Random(42)
    probes = [
        Probe(candidate("heavy", weight=3), 5.0),
        Probe(candidate("light", weight=1), 5.0),
        Probe(candidate("none", weight=0), 5.0),
    ]

    firsts = [label(rank(probes, rng=rng)[0]) for _ in range(4000)]
    orders = {tuple(labels(rank(probes, rng=rng))) for _ in range(200)}

    assert 0.70 < firsts.count("heavy") / len(firsts) < 0.80
    assert all(order[-1] == "none" for order in orders)  # weight 0 only when nothing weighted is left


def test_latencies_within_one_bucket_count_as_equal():
    probes = [Probe(candidate("slower", weight=9), 4.0), Probe(candidate("faster", weight=1), 1.0)]

    assert labels(rank(probes, latency_bucket_ms=5.0)) == ["slower", "faster"]
    assert labels(rank(probes, latency_bucket_ms=0.0)) == ["faster", "slower"]


def test_demote_keeps_the_order_of_good_relays_and_puts_failed_ones_last_in_failing_order():
    a, b, c, d = (candidate(n) for n in "abcd")

    assert demote([a, b, c, d], [c.endpoint, a.endpoint]) == [b, d, c, a]


probes_strategy = st.lists(
    st.builds(
        Probe,
        candidate=st.builds(
            RelayCandidate,
            host=st.from_regex(r"[a-z]{1,8}", fullmatch=True),
            port=st.integers(1, 65535),
            region=st.just("a"),
            priority=st.integers(0, 65535),
            weight=st.integers(0, 65535),
            ttl=st.just(60.0),
        ),
        latency_ms=st.none() | st.floats(0, 10_000, allow_nan=False),
    ),
    max_size=30,
)


@given(probes=probes_strategy, bucket=st.sampled_from([0.0, 1.0, 5.0]), seed=st.none() | st.integers(0, 2**32))
def test_rank_keeps_exactly_the_alive_candidates_with_priorities_non_decreasing(probes, bucket, seed):
    ranked = rank(probes, latency_bucket_ms=bucket, rng=None if seed is None else random.Random(seed))

    alive = [p.candidate for p in probes if p.latency_ms is not None]
    assert sorted(ranked, key=repr) == sorted(alive, key=repr)  # a permutation of the alive: no dead, none lost
    priorities = [c.priority for c in ranked]
    assert priorities == sorted(priorities)
