"""Measure the agent's link to its Access relay with speedtest-cli's mini mode.

The relay serves a Speedtest Mini endpoint (``access/speedtest.py``) at ``<relay HTTPS base>/speedtest``;
the test downloads its images and uploads to it, so nothing leaves the agent-relay path. Three
things in speedtest-cli would otherwise reach further, and each is closed here:

- ``Speedtest()`` always fetches speedtest.net's configuration first. ``_RelaySpeedtest`` overrides
  ``get_config`` with the configuration written locally (sizes, counts, durations).
- speedtest-cli's ``build_opener`` trusts only the system CA store (its HTTPS handler accepts an
  SSL context, but ``build_opener`` never passes one) and honours proxy variables from the
  environment. ``_relay_opener`` assembles the same speedtest-cli handlers, the HTTPS one given a
  context trusting the platform CA, and no proxy handler and no redirect handler.
- ``get_best_server``'s latency probe opens its own connections with the default trust store; the
  override probes over a connection using the same context.

speedtest-cli is blocking (urllib and threads); it runs in a worker thread, and a stop event
winds its threads down when the measurement is cancelled or runs out of time.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import ssl
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import speedtest

from common.errors import IdlegridError, PKIError
from common.pki import client_tls_context

MINI_PATH = "/speedtest"  # where the relay mounts its Mini server (access.speedtest.add_speedtest_routes)
LATENCY_PROBES = 3


class BandwidthError(IdlegridError):
    code = "bandwidth_failed"


class BandwidthResult(msgspec.Struct, frozen=True, kw_only=True):
    download_mbps: float
    upload_mbps: float
    latency_ms: float
    server: str  # the Mini server measured against


class SpeedtestPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How much to move. Download sizes are speedtest.net's own; upload chunks are lighter than its
    7 MiB ones because speedtest-cli allocates every chunk before it starts."""

    download_sides: tuple[int, ...] = (350, 500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000)
    downloads_per_side: int = 4
    upload_bytes: tuple[int, ...] = (524_288, 1_048_576, 2_097_152)
    uploads_per_size: int = 16
    phase_s: float = 10.0  # download and upload each stop after this long

    def __post_init__(self) -> None:
        short = [size for size in self.upload_bytes if not _uploads_whole(size)]
        if short:
            raise ValueError(f"upload sizes {short} would stall: speedtest-cli sends fewer bytes than it announces for them")


def _uploads_whole(size: int) -> bool:
    """speedtest-cli builds an upload body of ``size`` bytes from whole 36-character runs and announces
    ``size`` as its length; where the runs fall short (65536 does, by 7 bytes) the server waits for
    bytes that never come and the request stalls until its socket times out."""
    return round(size / 36) * 36 >= size - len("content1=")


async def measure_bandwidth(
    base_url: str,
    *,
    ca_file: Path | None = None,
    timeout_s: float = 30.0,
    threads: int = 2,
    plan: SpeedtestPlan | None = None,
) -> BandwidthResult:
    """Download, upload and latency between this host and the relay at ``base_url`` (``https://HOST:PORT``).

    ``ca_file`` is the CA that signed the relay's certificate (the platform CA); without it HTTPS
    trusts the system store. Each phase is cut to a third of ``timeout_s`` so the whole test fits in it.
    """
    mini_url = _mini_url(base_url)
    context = _tls_context(ca_file) if mini_url.startswith("https:") else None
    plan = plan or SpeedtestPlan()
    plan = msgspec.structs.replace(plan, phase_s=min(plan.phase_s, timeout_s / 3))
    stop = _StopSignal()
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_run_speedtest, mini_url, plan, context, timeout_s, threads, stop), timeout_s
        )
    except TimeoutError:
        raise BandwidthError(f"speed test against {mini_url} did not finish within {timeout_s:g} s") from None
    finally:
        stop.set()  # a cancelled or timed-out test must not keep its threads transferring


def _mini_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BandwidthError(f"speed test needs the relay's http(s)://HOST:PORT base URL, got {base_url!r}")
    return base_url.rstrip("/") + MINI_PATH


def _tls_context(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is None:
        return ssl.create_default_context()
    try:
        return client_tls_context(ca_file)
    except PKIError as exc:
        raise BandwidthError(f"speed test cannot trust the relay: {exc}") from None


def _run_speedtest(
    mini_url: str,
    plan: SpeedtestPlan,
    context: ssl.SSLContext | None,
    timeout_s: float,
    threads: int,
    stop: threading.Event,
) -> BandwidthResult:
    try:
        test = _RelaySpeedtest(plan, context, timeout_s=timeout_s, stop=stop)
        test.get_best_server(test.set_mini_server(mini_url))
        test.download(threads=threads)
        test.upload(threads=threads)
    except (speedtest.SpeedtestException, OSError, http.client.HTTPException) as exc:
        raise BandwidthError(f"speed test against {mini_url} failed: {exc or type(exc).__name__}") from None
    results = test.results
    if not results.bytes_received or not results.bytes_sent:
        raise BandwidthError(
            f"speed test against {mini_url} moved no data (received {results.bytes_received} B, sent {results.bytes_sent} B)"
        )
    return BandwidthResult(
        download_mbps=round(results.download / 1e6, 3),
        upload_mbps=round(results.upload / 1e6, 3),
        latency_ms=results.ping,
        server=mini_url,
    )


class _StopSignal(threading.Event):
    """speedtest-cli polls its shutdown event with ``isSet``, a name threading.Event deprecates."""

    def isSet(self) -> bool:  # noqa: N802 - the name speedtest-cli calls
        return self.is_set()


class _RelaySpeedtest(speedtest.Speedtest):
    """speedtest-cli's Speedtest, configured locally and talking only to the relay."""

    def __init__(self, plan: SpeedtestPlan, context: ssl.SSLContext | None, *, timeout_s: float, stop: threading.Event) -> None:
        self._plan = plan  # read by get_config, which the base __init__ calls
        self._context = context
        super().__init__(timeout=timeout_s, shutdown_event=stop)
        self._opener = _relay_opener(context, timeout_s)

    def get_config(self) -> dict[str, Any]:
        """What speedtest.net's configuration would provide, written here instead of fetched."""
        plan = self._plan
        self.config.update(
            {
                "client": {"ip": "", "isp": "idlegrid relay", "lat": "0", "lon": "0", "country": ""},
                "ignore_servers": [],
                "sizes": {"download": list(plan.download_sides), "upload": list(plan.upload_bytes)},
                "counts": {"download": plan.downloads_per_side, "upload": plan.uploads_per_size},
                "threads": {"download": 2, "upload": 2},  # overridden by the threads argument
                "length": {"download": plan.phase_s, "upload": plan.phase_s},
                # upload() waits for exactly this many requests, so it must equal the number it builds.
                "upload_max": len(plan.upload_bytes) * plan.uploads_per_size,
            }
        )
        self.lat_lon = (0.0, 0.0)
        return self.config

    def set_mini_server(self, server: str) -> list[dict[str, Any]]:
        """speedtest-cli's, after one plain fetch of the index: speedtest-cli's own fetch drops the reason
        a connection failed, and "refused" or "certificate verify failed" is what a provider needs."""
        try:
            self._opener.open(server).close()
        except urllib.error.URLError as exc:
            raise speedtest.SpeedtestMiniConnectFailure(str(exc.reason)) from None
        return super().set_mini_server(server)

    def get_best_server(self, servers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The single Mini server, with its latency measured over a connection trusting our CA."""
        best = (servers or self.servers)[0]
        best["latency"] = self._latency_ms(os.path.dirname(best["url"]) + "/latency.txt")
        self.results.ping, self.results.server = best["latency"], best
        self._best.update(best)
        return best

    def _latency_ms(self, url: str) -> float:
        """Median HTTP round trip on an open connection: connection set-up and TLS handshake excluded."""
        parts = urlsplit(url)
        connection = _connection(parts.scheme, parts.netloc, self._context, self._timeout)
        try:
            connection.connect()
            rounds = [_round_trip(connection, parts.path) for _ in range(LATENCY_PROBES)]
        finally:
            connection.close()
        return round(statistics.median(rounds) * 1000.0, 3)


def _connection(scheme: str, netloc: str, context: ssl.SSLContext | None, timeout_s: float) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(netloc, timeout=timeout_s, context=context)
    return http.client.HTTPConnection(netloc, timeout=timeout_s)


def _round_trip(connection: http.client.HTTPConnection, path: str) -> float:
    start = time.perf_counter()
    connection.request("GET", path, headers={"Cache-Control": "no-cache"})
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    if response.status != 200 or body[:9] != b"test=test":
        raise speedtest.SpeedtestBestServerFailure(f"latency probe got HTTP {response.status}, not a Mini server")
    return elapsed


def _relay_opener(context: ssl.SSLContext | None, timeout_s: float) -> urllib.request.OpenerDirector:
    """speedtest-cli's handlers, the HTTPS one trusting ``context``; no proxy, no redirect: only the relay."""
    opener = urllib.request.OpenerDirector()
    opener.addheaders = [("User-agent", speedtest.build_user_agent())]
    for handler in (
        speedtest.SpeedtestHTTPHandler(timeout=timeout_s),
        speedtest.SpeedtestHTTPSHandler(context=context, timeout=timeout_s),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener
