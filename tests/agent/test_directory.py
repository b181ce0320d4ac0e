"""The relay directory: merged with the configured relays, ranked home region first and by latency, kept on disk,
and what the connector fails over along when DNS gives it nothing."""

from __future__ import annotations

import stat
from pathlib import Path

from agent.connector import RelayConnector
from agent.directory import (
    DIRECTORY_FILE,
    load_directory,
    merge_relays,
    probe_relays,
    rank_relays,
    save_directory,
    tcp_latency_ms,
)
from common.wire import RelayEntry
from tests.agent.test_discovery import Clock, running_relays

EU1 = RelayEntry(relay_id="eu-1", region="eu", url="wss://eu-1:7001")
EU2 = RelayEntry(relay_id="eu-2", region="eu", url="wss://eu-2:7002")
US1 = RelayEntry(relay_id="us-1", region="us", url="wss://us-1:7003")
AP1 = RelayEntry(relay_id="ap-1", region="ap", url="wss://ap-1:7004")


def ids(entries: list[RelayEntry]) -> list[str]:
    return [entry.relay_id or entry.url for entry in entries]


# --- merging and ranking (pure) ------------------------------------------------------------------------------


def test_the_configured_relays_join_the_directory_once_each_with_their_region_unknown():
    merged = merge_relays([EU1, US1], ["wss://us-1:7003", "wss://enrolled:7000"])
    assert ids(merged) == ["eu-1", "us-1", "wss://enrolled:7000"]
    assert merged[2].region == ""


def test_the_home_region_comes_first_then_the_others_each_by_latency():
    latencies = {EU1.url: 40.0, EU2.url: 12.0, US1.url: 3.0, AP1.url: 90.0}
    assert ids(rank_relays([AP1, EU1, US1, EU2], latencies, home_region="eu")) == ["eu-2", "eu-1", "us-1", "ap-1"]


def test_latencies_within_one_bucket_keep_the_directorys_order():
    latencies = {EU1.url: 3.9, EU2.url: 0.2}
    assert ids(rank_relays([EU1, EU2], latencies, home_region="eu", latency_bucket_ms=5.0)) == ["eu-1", "eu-2"]
    assert ids(rank_relays([EU1, EU2], latencies, home_region="eu", latency_bucket_ms=0.0)) == ["eu-2", "eu-1"]


def test_an_unreachable_relay_comes_last_even_from_the_home_region_but_is_kept():
    latencies = {EU1.url: None, US1.url: 80.0}
    assert ids(rank_relays([EU1, US1], latencies, home_region="eu")) == ["us-1", "eu-1"]


def test_relays_the_operator_named_come_first_in_their_order_then_the_directory():
    latencies = {EU1.url: 3.0, EU2.url: 4.0, US1.url: 90.0, AP1.url: 50.0}
    ranked = rank_relays([EU1, EU2, US1, AP1], latencies, home_region="eu", preferred_urls=[AP1.url, US1.url])
    assert ids(ranked) == ["ap-1", "us-1", "eu-1", "eu-2"]


def test_without_a_home_region_latency_alone_decides():
    latencies = {EU1.url: 30.0, US1.url: 10.0}
    assert ids(rank_relays([EU1, US1], latencies, home_region="")) == ["us-1", "eu-1"]


async def test_the_probe_measures_every_relay_and_gives_none_for_one_that_refuses():
    async with running_relays(["up", "gone"]) as relays:
        alive = RelayEntry(relay_id="up", region="eu", url=f"wss://127.0.0.1:{relays['up'].port}")
        dead = RelayEntry(relay_id="gone", region="eu", url=f"wss://127.0.0.1:{relays['gone'].port}")
        await relays["gone"].close()
        latencies = await probe_relays([alive, dead], tcp_latency_ms, timeout_s=1.0)
    latency = latencies[alive.url]
    assert latency is not None and latency >= 0
    assert latencies[dead.url] is None


# --- on disk ---------------------------------------------------------------------------------------------------


def test_the_directory_survives_a_restart_in_a_file_only_the_agent_can_read(tmp_path: Path):
    assert load_directory(tmp_path) == []  # before the Master ever sent one
    save_directory(tmp_path, [EU1, US1])
    assert load_directory(tmp_path) == [EU1, US1]
    assert stat.S_IMODE((tmp_path / DIRECTORY_FILE).stat().st_mode) == 0o600


def test_an_unreadable_directory_file_is_ignored_not_fatal(tmp_path: Path):
    (tmp_path / DIRECTORY_FILE).write_text("{not json")
    assert load_directory(tmp_path) == []


# --- failing over along it -------------------------------------------------------------------------------------


class Probe:
    """Latencies set by the test; a relay not listed refuses (OSError), as a dead relay does."""

    def __init__(self, latencies: dict[str, float]) -> None:
        self.latencies = latencies
        self.calls = 0

    async def __call__(self, url: str) -> float:
        self.calls += 1
        if url not in self.latencies:
            raise OSError(f"connection refused by {url}")
        return self.latencies[url]


def directory_connector(probe: Probe, clock: Clock | None = None, **settings: object) -> RelayConnector:
    return RelayConnector(
        static_urls=["wss://enrolled:7000"],
        directory=[EU1, EU2, US1],
        home_region="eu",
        probe=probe,
        clock=clock or Clock(),
        **settings,  # type: ignore[arg-type]
    )


async def lost(connector: RelayConnector) -> str:
    """The next pick is lost after a welcome (its relay died); returns the relay picked after it."""
    connector.ended(await connector.next_relay(), welcomed=True, error=OSError("connection lost"))
    return (await connector.next_relay()).url


async def test_without_dns_the_agent_dials_the_nearest_relay_of_its_home_region():
    connector = directory_connector(Probe({EU1.url: 20.0, EU2.url: 9.0, US1.url: 1.0, "wss://enrolled:7000": 1.0}))
    target = await connector.next_relay()
    assert (target.url, target.region) == (EU2.url, "eu")


async def test_when_its_relay_dies_it_fails_over_home_region_first_then_to_other_regions():
    probe = Probe({EU1.url: 20.0, EU2.url: 9.0, US1.url: 1.0})
    connector = directory_connector(probe)
    assert (await connector.next_relay()).url == EU2.url
    assert await lost(connector) == EU1.url
    assert await lost(connector) == US1.url
    assert await lost(connector) == "wss://enrolled:7000"  # refused the probe: last, still tried


async def test_once_every_relay_failed_they_are_probed_again_and_the_best_comes_back_first():
    probe = Probe({EU2.url: 9.0, US1.url: 1.0})
    connector = directory_connector(probe)
    tried = []
    for _ in range(4):  # eu-2, us-1, then the two that refused the probe: every relay fails once
        target = await connector.next_relay()
        tried.append(target.url)
        connector.ended(target, welcomed=False, error=OSError("refused"))
    assert tried == [EU2.url, US1.url, EU1.url, "wss://enrolled:7000"]
    calls = probe.calls
    probe.latencies[EU1.url] = 2.0  # eu-1 is back
    assert (await connector.next_relay()).url == EU1.url
    assert probe.calls > calls


async def test_a_new_directory_from_the_master_is_ranked_at_the_next_pick():
    probe = Probe({EU1.url: 20.0, EU2.url: 9.0, US1.url: 1.0, AP1.url: 1.0})
    connector = directory_connector(probe)
    assert (await connector.next_relay()).url == EU2.url
    assert connector.update_directory([US1, AP1]) is True
    assert connector.update_directory([US1, AP1]) is False  # the same directory again changes nothing
    assert (await connector.next_relay()).url in (US1.url, AP1.url)


async def test_the_ranking_is_reused_until_its_ttl_then_measured_again():
    clock = Clock()
    probe = Probe({EU1.url: 20.0, EU2.url: 9.0, US1.url: 1.0})
    connector = directory_connector(probe, clock, directory_rank_ttl_s=30.0)
    await connector.next_relay()
    first = probe.calls
    await connector.next_relay()
    assert probe.calls == first  # cached: a reconnect storm does not probe every relay on every attempt
    clock.now += 31.0
    await connector.next_relay()
    assert probe.calls > first


async def test_with_probing_off_or_a_single_relay_nothing_is_probed_and_order_and_region_decide():
    probe = Probe({EU1.url: 20.0, EU2.url: 9.0, US1.url: 1.0})
    connector = directory_connector(probe, probe_relays=False)
    assert (await connector.next_relay()).url == EU1.url  # home region, directory order
    alone = RelayConnector(static_urls=["wss://only:7000"], probe=probe)
    assert (await alone.next_relay()).url == "wss://only:7000"
    assert probe.calls == 0
