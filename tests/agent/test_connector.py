"""Choosing the relay to dial and the delay before it: SRV and TXT records served by a real dnsmasq, relays played
by real TCP listeners (and a real websockets server where the handshake matters) on 127.0.0.1.

Region ``a`` (home) has a1 (SRV priority 10) and a2 (priority 20); region ``b`` has b1 and is a's fallback (TXT).
All listeners are on loopback, so their measured latencies fall in one bucket and SRV priority decides.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request, Response

from agent.config import AgentConfig
from agent.connector import NoRelayAvailable, RelayConnector, RelayTarget, retry_after_s
from agent.discovery import DiscoveryConfig, RelayDiscovery, fallback_name, srv_name
from common.errors import ConfigError
from common.pki import CertificateAuthority, CertRole, client_tls_context, server_tls_context, write_private_key
from tests.agent.test_discovery import Clock, Relay, running_relays  # a TCP listener standing in for a relay; a hand clock
from tests.support.dnsmasq import Dnsmasq, HostRecord, Record, SrvRecord, TxtRecord

ZONE = "idlegrid.test"
DNS_TTL_S = 60  # longer than any test: a re-resolve seen here is one the connector forced
LAYOUT = {"a": {"a1": 10, "a2": 20}, "b": {"b1": 10}}  # region -> relay -> SRV priority


def records_for(relays: dict[str, Relay]) -> list[Record]:
    records: list[Record] = [TxtRecord(fallback_name("a", ZONE).rstrip("."), "regions=b")]
    for region, members in LAYOUT.items():
        for name, priority in members.items():
            relay = relays[name]
            records += [
                SrvRecord(srv_name(region, ZONE).rstrip("."), relay.host, relay.port, priority, 10),
                HostRecord(relay.host, "127.0.0.1", DNS_TTL_S),
            ]
    return records


@pytest.fixture
async def relays() -> AsyncIterator[dict[str, Relay]]:
    async with running_relays(name for members in LAYOUT.values() for name in members) as started:
        yield started


@pytest.fixture
def dns(tmp_path: Path, relays: dict[str, Relay]) -> Iterator[Dnsmasq]:
    with Dnsmasq(ZONE, local_ttl=DNS_TTL_S, workdir=tmp_path / "dnsmasq").start(records_for(relays)) as server:
        yield server


def connector_of(dns: Dnsmasq, *, static: list[str] | None = None, **settings: object) -> RelayConnector:
    config = DiscoveryConfig(
        domain=ZONE, region="a", nameservers=[dns.address], port=dns.port, timeout_s=1.0, probe_timeout_s=1.0
    )
    return RelayConnector(static_urls=static or [], discovery=RelayDiscovery(config), rng=random.Random(1), **settings)  # type: ignore[arg-type]


def name(target: RelayTarget) -> str:
    return target.url.removeprefix("wss://").split(".")[0] if target.candidate else target.url


async def failed(connector: RelayConnector, *, welcomed: bool = False) -> str:
    """The next pick fails (or is lost after a welcome); returns the relay picked after it."""
    connector.ended(await connector.next_relay(), welcomed=welcomed, error=OSError("refused"))
    return name(await connector.next_relay())


# --- which relay ----------------------------------------------------------------------------------------------


async def test_dns_mode_picks_the_home_regions_best_relay_named_by_its_srv_target_and_dialled_at_its_address(dns, relays):
    target = await connector_of(dns).next_relay()

    assert target.url == f"wss://a1.{ZONE}:{relays['a1'].port}"
    assert (target.address, target.region) == ("127.0.0.1", "a")


async def test_a_failed_relay_is_retried_only_after_every_other_one_of_the_ranking(dns):
    connector = connector_of(dns)

    assert name(await connector.next_relay()) == "a1"
    assert await failed(connector) == "a2"
    assert await failed(connector) == "a1"  # both failed: resolved and probed again; both still answer


async def test_with_the_home_region_down_it_fails_over_to_the_fallback_region_and_goes_home_on_the_next_reconnect(dns, relays):
    connector = connector_of(dns)
    assert name(await connector.next_relay()) == "a1"
    for relay in ("a1", "a2"):
        await relays[relay].close()

    assert await failed(connector, welcomed=True) == "a2"  # a1 lost; a2 is still in the cached ranking
    assert await failed(connector) == "b1"  # every home relay failed: resolved again, only the fallback lives

    for relay in ("a1", "a2"):
        await relays[relay].start()
    assert await failed(connector, welcomed=True) == "a1"  # b1 lost: home is asked first, though the TTL holds


async def test_while_dns_fails_the_static_relays_are_used_and_dns_is_asked_again_after_a_pause(dns, relays):
    clock = Clock()
    connector = connector_of(dns, static=["wss://127.0.0.1:7201", "wss://127.0.0.1:7202"], clock=clock, dns_retry_s=30.0)
    dns.stop()

    assert name(await connector.next_relay()) == "wss://127.0.0.1:7201"
    assert await failed(connector) == "wss://127.0.0.1:7202"

    dns.replace(dns.records)  # DNS is back, on the same port
    assert await failed(connector) == "wss://127.0.0.1:7201"  # within the pause: DNS is not asked
    clock.advance(31.0)
    assert name(await connector.next_relay()) == "a1"


async def test_with_no_live_relay_anywhere_and_no_static_list_it_says_what_it_tried(dns, relays):
    for relay in relays.values():
        await relay.close()

    with pytest.raises(NoRelayAvailable, match="region 'a'.*neither access_urls nor the Master's relay directory"):
        await connector_of(dns).next_relay()


async def test_a_relay_found_by_dns_is_dialled_at_its_address_and_its_certificate_checked_against_its_name(tmp_path, dns):
    ca = CertificateAuthority.create("test CA")
    (tmp_path / "ca.crt").write_bytes(ca.chain_pem())
    key_pem, cert_pem = ca.issue_keypair(CertRole.ACCESS, "relay-a1", valid_s=600, dns_names=[f"a1.{ZONE}"])
    write_private_key(tmp_path / "a1.key", key_pem)
    (tmp_path / "a1.crt").write_bytes(cert_pem)
    server_tls = server_tls_context(tmp_path / "a1.crt", tmp_path / "a1.key", tmp_path / "ca.crt", require_client_cert=False)

    async with serve(lambda ws: ws.send("hi"), "127.0.0.1", 0, ssl=server_tls) as server:
        port = server.sockets[0].getsockname()[1]
        dns.replace(
            [
                SrvRecord(srv_name("a", ZONE).rstrip("."), f"a1.{ZONE}", port, 10, 10),
                HostRecord(f"a1.{ZONE}", "127.0.0.1", DNS_TTL_S),
            ]
        )
        connector = connector_of(dns)
        target = await connector.next_relay()
        async with connector.dial(target, ssl=client_tls_context(tmp_path / "ca.crt"), open_timeout=5) as ws:
            assert await ws.recv() == "hi"

        # The certificate names a1.idlegrid.test only: dialled by address, without the name, it is refused.
        with pytest.raises(ssl.SSLCertVerificationError, match="127.0.0.1"):
            async with connector.dial(
                RelayTarget(f"wss://127.0.0.1:{port}"), ssl=client_tls_context(tmp_path / "ca.crt"), open_timeout=5
            ):
                pass


async def test_the_static_list_is_tried_round_robin():
    connector = RelayConnector(static_urls=["wss://r1:1", "wss://r2:2"])

    assert name(await connector.next_relay()) == "wss://r1:1"
    assert await failed(connector) == "wss://r2:2"
    assert await failed(connector) == "wss://r1:1"


def test_settings_that_name_no_relay_are_refused_with_what_to_set():
    with pytest.raises(ConfigError, match="--access.*--dns-domain"):
        RelayConnector()
    with pytest.raises(ConfigError, match="region"):
        RelayConnector.from_config(AgentConfig(dns_domain=ZONE), static_urls=[])


# --- how long to wait -----------------------------------------------------------------------------------------


def test_backoff_is_jittered_under_an_exponential_ceiling_capped_and_reset_by_a_welcome():
    target = RelayTarget("wss://r1:1")
    delays_by_attempt: dict[int, list[float]] = {}
    for seed in range(200):
        connector = RelayConnector(static_urls=[target.url], backoff_initial_s=0.5, backoff_max_s=8.0, rng=random.Random(seed))
        for attempt in range(8):
            delays_by_attempt.setdefault(attempt, []).append(connector.ended(target, welcomed=False))
        assert connector.ended(target, welcomed=True) <= 0.5  # a welcomed session starts the count again

    for attempt, delays in delays_by_attempt.items():
        ceiling = min(8.0, 0.5 * 2**attempt)
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 2  # spread over the window, not in step


def _status(code: int, **headers: str) -> InvalidStatus:
    return InvalidStatus(Response(code, "", Headers(headers)))


def test_retry_after_is_read_as_seconds_or_an_http_date_and_only_from_a_503_or_429():
    now = time.time()
    in_ten_s = email.utils.formatdate(now + 10, usegmt=True)

    assert retry_after_s(_status(503, **{"Retry-After": "2"})) == 2.0
    assert 9.0 <= retry_after_s(_status(503, **{"Retry-After": in_ten_s}), now=now) <= 10.0  # type: ignore[operator]
    assert retry_after_s(_status(503)) is None
    assert retry_after_s(_status(503, **{"Retry-After": "soon"})) is None
    assert retry_after_s(_status(429, **{"Retry-After": "3"})) == 3.0
    assert retry_after_s(_status(500, **{"Retry-After": "2"})) is None
    assert retry_after_s(OSError("refused")) is None


def test_a_retry_after_is_honoured_with_jitter_and_capped():
    target = RelayTarget("wss://r1:1")
    for seed in range(50):
        connector = RelayConnector(static_urls=[target.url], retry_after_max_s=60.0, rng=random.Random(seed))
        assert 2.0 <= connector.ended(target, welcomed=False, error=_status(503, **{"Retry-After": "2"})) <= 3.0
        assert 60.0 <= connector.ended(target, welcomed=False, error=_status(503, **{"Retry-After": "86400"})) <= 90.0


class BusyRelay:
    """A real websockets server that answers every handshake 503, with a Retry-After when given one."""

    def __init__(self, retry_after: str | None) -> None:
        self.retry_after = retry_after
        self.attempts: list[float] = []

    def refuse(self, connection: ServerConnection, request: Request) -> Response:
        self.attempts.append(time.monotonic())
        response = connection.respond(503, "too many connections opening; retry later\n")
        if self.retry_after is not None:
            response.headers["Retry-After"] = self.retry_after
        return response


async def attempt_times(relay: BusyRelay, attempts: int) -> list[float]:
    """Run the connector's own loop against ``relay`` until it has dialled ``attempts`` times."""
    async with serve(lambda ws: ws.close(), "127.0.0.1", 0, process_request=relay.refuse) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        connector = RelayConnector(static_urls=[url], backoff_initial_s=0.05, backoff_max_s=0.2)
        stopping = asyncio.Event()

        async def session(target: RelayTarget) -> bool:
            if len(relay.attempts) >= attempts - 1:
                stopping.set()
            async with connector.dial(target, open_timeout=5):
                return True

        await asyncio.wait_for(connector.run(session, stopping), timeout=15)
    return relay.attempts


async def test_the_next_attempt_after_a_503_with_retry_after_2_is_not_before_2_seconds():
    first, second = await attempt_times(BusyRelay(retry_after="2"), attempts=2)

    assert 2.0 <= second - first <= 3.5


async def test_a_503_without_retry_after_gets_the_ordinary_backoff():
    times = await attempt_times(BusyRelay(retry_after=None), attempts=3)

    assert all(later - earlier < 1.0 for earlier, later in zip(times, times[1:]))
