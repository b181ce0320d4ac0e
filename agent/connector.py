"""Which Access relay the agent dials next, and how long it waits before dialling.

Where relays come from:

- DNS (``dns_domain`` set): ``RelayDiscovery`` ranks the relays of the agent's home region, or of its fallback
  regions when none of those is alive (see agent/discovery.py). A candidate whose target resolved through the
  configured nameservers (a private zone) is dialled at that address, while the URL keeps the SRV target, so
  the TLS handshake checks the relay's certificate against that name and the Host header carries it.
- The relay directory (agent/directory.py): the relays the Master last named, with the static list (``access_urls``,
  or the relays stored at enrollment), ranked home region first and by measured latency, re-probed when every
  one of them was tried or the ranking is older than ``directory_rank_ttl_s``. Without DNS it is all the agent
  has; in DNS mode it is the fallback while DNS itself fails, or finds no live relay anywhere.

Which one next (DNS mode):

- A relay that failed to connect, or whose connection was lost, is not tried again until every other relay
  of the current ranking was; once all of them failed, DNS is asked again and the relays probed again.
- After a relay outside the home region fails or is lost, the next pick resolves afresh, so the agent goes
  home as soon as home answers again. A connected agent stays where it is (no flapping): a TTL expiry only
  changes where the next reconnect goes.

How long to wait: capped exponential backoff with full jitter (agent/backoff.py), counted in consecutive
sessions that the Master did not welcome, so a relay that accepts and drops at once is not hammered. A relay
that answers the WebSocket handshake ``503`` (busy with a reconnect storm) or ``429`` (this agent reconnects
too often) with ``Retry-After`` gets at least that long, spread over up to half as long again so the agents it
told come back out of step, and the next pick prefers another relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from agent.backoff import full_jitter
from agent.config import AgentConfig
from agent.directory import merge_relays, probe_relays, rank_relays, tcp_latency_ms
from agent.discovery import DiscoveryConfig, DiscoveryError, RelayCandidate, RelayDiscovery
from common.errors import ConfigError, IdlegridError, ProtocolError
from common.wire import RelayEntry

log = logging.getLogger(__name__)

# What ends an attempt or a session without ending the agent: the next relay is tried after a delay.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionClosed,
    InvalidHandshake,
    InvalidURI,
    TimeoutError,
    ProtocolError,
)
# Answers to the WebSocket handshake whose Retry-After is honoured: the relay is busy opening connections (503),
# or this agent reconnects too often (429).
RETRY_LATER_STATUSES = frozenset({429, 503})
RETRY_AFTER_SPREAD = 0.5  # a Retry-After of T waits uniformly in [T, T * (1 + spread)]


class NoRelayAvailable(IdlegridError):
    """Neither DNS nor the configured list gave a relay to dial; the message says what was tried."""

    code = "no_relay"


@dataclass(frozen=True)
class RelayTarget:
    """One relay to dial: its URL (names it for TLS and the Host header) and, from DNS, the address to dial."""

    url: str
    address: str | None = None  # None: the system resolver resolves the URL's host
    region: str | None = None  # known for relays found by DNS or named in the directory
    candidate: RelayCandidate | None = None

    @classmethod
    def discovered(cls, candidate: RelayCandidate) -> RelayTarget:
        address = candidate.addresses[0] if candidate.addresses else None
        return cls(candidate.url, address, candidate.region, candidate)

    def __str__(self) -> str:
        return f"{self.url} (at {self.address})" if self.address else self.url


# A session: connect to the relay and serve until the link ends; returns whether the Master welcomed the agent
# on it. It raises one of CONNECTION_ERRORS when the attempt failed before that.
Session = Callable[[RelayTarget], Awaitable[bool]]


def retry_after_s(error: BaseException | None, *, now: float | None = None) -> float | None:
    """Seconds a relay asked us to stay away: the Retry-After of a 503 or 429 handshake answer, else None.

    Retry-After is either delay-seconds or an HTTP-date (RFC 9110 §10.2.3); anything else is ignored."""
    if not isinstance(error, InvalidStatus) or error.response.status_code not in RETRY_LATER_STATUSES:
        return None
    value = (error.response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RelayConnector:
    """Picks the relay to dial next and the delay before it, from DNS discovery or a static list."""

    def __init__(
        self,
        *,
        static_urls: Sequence[str] = (),
        preferred_urls: Sequence[str] = (),
        directory: Sequence[RelayEntry] = (),
        home_region: str = "",
        discovery: RelayDiscovery | None = None,
        probe: Callable[[str], Awaitable[float]] | None = None,
        probe_relays: bool = True,
        probe_timeout_s: float = 2.0,
        latency_bucket_ms: float = 5.0,
        directory_rank_ttl_s: float = 60.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 300.0,
        dns_retry_s: float = 30.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not static_urls and not directory and discovery is None:
            raise ConfigError(
                "no Access relay to connect to: set access_urls (--access wss://HOST:PORT) or a discovery domain (--dns-domain)"
            )
        self.static_urls = list(static_urls)
        self.preferred_urls = list(preferred_urls)  # named by the operator (--access): tried before the directory
        self.directory = list(directory)
        self.discovery = discovery
        self.home_region = discovery.config.region if discovery is not None else home_region
        self._probe = probe or tcp_latency_ms
        self.probe_relays = probe_relays
        self.probe_timeout_s = probe_timeout_s
        self.latency_bucket_ms = latency_bucket_ms
        self.directory_rank_ttl_s = directory_rank_ttl_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self.dns_retry_s = dns_retry_s
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._failures = 0  # consecutive sessions the Master did not welcome
        self._ranking: list[RelayEntry] = []  # the directory and static list, best first
        self._ranked_at = -float("inf")
        self._ranking_tried: set[str] = set()  # URLs of the ranking that failed or were lost
        self._tried: set[tuple[str, int]] = set()  # relays of the current ranking that failed
        self._resolve_next = False
        self._dns_quiet_until = -float("inf")

    @classmethod
    def from_config(cls, config: AgentConfig, *, static_urls: Sequence[str], directory: Sequence[RelayEntry] = ()) -> Self:
        discovery = None
        if config.dns_domain:
            if not config.region:
                raise ConfigError("DNS discovery needs the agent's region: set region (--region)")
            discovery = RelayDiscovery(
                DiscoveryConfig(
                    domain=config.dns_domain,
                    region=config.region,
                    nameservers=list(config.dns_nameservers),
                    port=config.dns_port,
                )
            )
        return cls(
            static_urls=static_urls,
            preferred_urls=config.access_urls,
            directory=directory,
            home_region=config.region,
            discovery=discovery,
            probe_relays=config.relay_probe,
            probe_timeout_s=config.relay_probe_timeout_s,
            directory_rank_ttl_s=config.directory_rank_ttl_s,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=config.backoff_max_s,
            retry_after_max_s=config.retry_after_max_s,
            dns_retry_s=config.dns_retry_s,
        )

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, session: Session, stopping: asyncio.Event) -> None:
        """Dial relays one session at a time until ``stopping`` is set."""
        while not stopping.is_set():
            target, welcomed = None, False
            error: BaseException | None = None
            try:
                target = await self.next_relay()
                welcomed = await session(target)
            except NoRelayAvailable as exc:
                error = exc
                log.warning("no relay to connect to", extra={"error": str(exc)})
            except CONNECTION_ERRORS as exc:
                error = exc
                log.warning("relay connection failed", extra={"relay": str(target), "error": _describe(exc)})
            if stopping.is_set():
                break
            delay = self.ended(target, welcomed=welcomed, error=error)
            log.info("reconnecting", extra={"delay_s": round(delay, 3), "failures": self._failures})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=delay)

    def dial(self, target: RelayTarget, **kwargs: Any) -> connect:
        """websockets' ``connect`` for ``target``: dials its address when DNS gave one, named by its URL."""
        if target.address:
            kwargs.setdefault("host", target.address)  # only the TCP destination; TLS still checks the URL's host
        return connect(target.url, **kwargs)

    # --- choosing --------------------------------------------------------------------------------

    async def next_relay(self) -> RelayTarget:
        """The relay to dial now: the best untried one from DNS, else the best untried one of the directory."""
        if self.discovery is not None and self._clock() >= self._dns_quiet_until:
            found = await self._next_discovered(self.discovery)
            if found is not None:
                return found
        relays = merge_relays(self.directory, self.static_urls)
        if not relays:
            raise NoRelayAvailable(self._nothing_found())
        ranking = await self._ranked_directory(relays)
        best = next(entry for entry in ranking if entry.url not in self._ranking_tried)
        return RelayTarget(best.url, region=best.region or None)

    def update_directory(self, relays: Sequence[RelayEntry]) -> bool:
        """The Master's latest directory; whether it changed. It is ranked afresh at the next pick."""
        relays = list(relays)
        if relays == self.directory:
            return False
        self.directory = relays
        self._ranked_at = -float("inf")
        return True

    async def _latencies(self, relays: list[RelayEntry]) -> dict[str, float | None]:
        """Measured, unless there is no choice to make or probing is off: then all equal, and order decides."""
        if len(relays) < 2 or not self.probe_relays:
            return {entry.url: 0.0 for entry in relays}
        return await probe_relays(relays, self._probe, timeout_s=self.probe_timeout_s)

    async def _ranked_directory(self, relays: list[RelayEntry]) -> list[RelayEntry]:
        """The directory ranked; probed again when it changed, when its ranking is old, or when every relay failed."""
        stale = self._clock() - self._ranked_at >= self.directory_rank_ttl_s
        changed = {entry.url for entry in relays} != {entry.url for entry in self._ranking}
        exhausted = all(entry.url in self._ranking_tried for entry in relays)
        if stale or changed or exhausted:
            latencies = await self._latencies(relays)
            self._ranking = rank_relays(
                relays,
                latencies,
                home_region=self.home_region,
                latency_bucket_ms=self.latency_bucket_ms,
                preferred_urls=self.preferred_urls,
            )
            self._ranked_at = self._clock()
            if exhausted:
                self._ranking_tried.clear()  # each one failed: every relay gets its chance again
            self._ranking_tried &= {entry.url for entry in relays}
        return self._ranking

    async def _next_discovered(self, discovery: RelayDiscovery) -> RelayTarget | None:
        try:
            ranking = await self._untried(discovery)
        except DiscoveryError as exc:
            if self.static_urls:  # the list keeps the agent going; DNS is asked again after a pause
                self._dns_quiet_until = self._clock() + self.dns_retry_s
            log.warning("relay discovery failed", extra={"error": str(exc), "fallback": self.static_urls})
            return None
        if not ranking:
            log.warning("DNS found no live relay", extra={"region": self.home_region, "fallback": self.static_urls})
            return None
        return RelayTarget.discovered(ranking[0])

    async def _untried(self, discovery: RelayDiscovery) -> list[RelayCandidate]:
        force, self._resolve_next = self._resolve_next, False
        if force or discovery.expired():
            self._tried.clear()  # a fresh ranking: every relay gets its chance again
        ranking = await discovery.ranked(force=force)
        untried = [c for c in ranking if c.endpoint not in self._tried]
        if ranking and not untried:  # each one failed: ask DNS and probe again, maybe home is back
            self._tried.clear()
            untried = await discovery.ranked(force=True)
        return untried

    def _nothing_found(self) -> str:
        if self.discovery is None:
            return "neither access_urls nor the Master's relay directory name a relay: enroll again or set access_urls"
        config = self.discovery.config
        return (
            f"DNS found no live relay for region {config.region!r} under {config.domain!r} "
            f"(nor in its fallback regions), and neither access_urls nor the Master's relay directory name a relay"
        )

    # --- after a session -------------------------------------------------------------------------

    def ended(self, target: RelayTarget | None, *, welcomed: bool, error: BaseException | None = None) -> float:
        """Record how a session with ``target`` ended; returns the seconds to wait before the next one."""
        if welcomed:
            self._failures = 0
        if target is not None:
            self._step_past(target)
        delay = self._delay(retry_after_s(error))
        self._failures += 1
        return delay

    def _step_past(self, target: RelayTarget) -> None:
        if target.candidate is None:
            self._ranking_tried.add(target.url)
            return
        assert self.discovery is not None
        self.discovery.mark_failed(target.candidate)
        self._tried.add(target.candidate.endpoint)
        if target.region != self.home_region:
            self._resolve_next = True  # away from home: look whether home is back before going anywhere else

    def _delay(self, retry_after: float | None) -> float:
        delay = full_jitter(self._failures, initial_s=self.backoff_initial_s, max_s=self.backoff_max_s, rng=self._rng)
        if retry_after is None:
            return delay
        asked = min(retry_after, self.retry_after_max_s)
        return max(delay, asked * (1.0 + RETRY_AFTER_SPREAD * self._rng.random()))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InvalidStatus):
        retry = exc.response.headers.get("Retry-After")
        return f"HTTP {exc.response.status_code}" + (f", Retry-After {retry}" if retry else "")
    return str(exc) or type(exc).__name__
