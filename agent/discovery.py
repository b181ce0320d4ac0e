"""Relay discovery: which Access relays an agent should dial, best first, found by DNS and measured latency.

DNS layout, per region, under the agent's configured domain:

- SRV ``_idlegrid._tcp.<region>.<domain>``: one record per relay (priority, weight, port, target).
  A target of ``.`` means "no service here" (RFC 2782) and is skipped. Targets are resolved (A and AAAA)
  through the same nameservers, so a private zone works end to end; the addresses travel on the candidate.
- TXT ``_idlegrid-fallback.<region>.<domain>``: the regions to try when none of this region's relays is
  alive, in preference order. The value is whitespace-separated ``key=value`` fields, of which only
  ``regions`` is read today (unknown keys are ignored, so the format can grow)::

      "regions=us-east,ap-south"

  The character-strings of one TXT record are concatenated first (as SPF does, RFC 7208 §3.3), so a
  value split at the 255-byte limit reads back whole. Beware: dnsmasq's ``--txt-record`` on the command
  line splits its value at commas into separate strings (``"regions=b" "c"``, read as ``regions=bc``);
  write the record quoted in a dnsmasq conf file instead. Unknown or malformed region names are dropped,
  as are the region itself and duplicates.

Ranking, per region (``rank``, pure): dead candidates are dropped; the alive ones are ordered by SRV
priority (lower first, always respected), then by measured latency in buckets of ``latency_bucket_ms``
(one TCP connect is noisy, and a few milliseconds are not worth piling every agent onto one relay), then,
among candidates equal in both, RFC 2782 style by weight: a weighted random order when an ``rng`` is given
(what the daemon does, so thousands of agents spread over equally good relays in proportion to weight),
heaviest first when not (deterministic, for tests and tools). Weight-0 relays come after weighted ones.

``RelayDiscovery.ranked`` ranks the agent's region; only if none of its relays is alive does it rank the
fallback regions of its TXT record (one level, not followed transitively), all of them, concatenated in TXT
order, so the daemon has somewhere to fail over to. The result is cached until the smallest TTL among the
records read (clamped to [min_ttl_s, max_ttl_s]) expires. An empty result is not cached.

The default probe times a plain TCP connect, not a TLS handshake: the SYN/SYN-ACK round trip is the network
latency we want, and it proves something listens. A TLS handshake would cost every relay an ECDSA signature
per probe during a reconnect storm, would be refused by a relay that requires a client certificate before
finishing (TLS 1.2), and timing it without verifying the certificate would be a habit worth not having.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import dns.asyncresolver
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver
import msgspec

from common.errors import ConfigError, IdlegridError

log = logging.getLogger(__name__)

SRV_LABEL = "_idlegrid._tcp"
FALLBACK_LABEL = "_idlegrid-fallback"
FALLBACK_KEY = "regions"
_T = TypeVar("_T")
_REGION_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


class DiscoveryError(IdlegridError):
    """DNS itself failed (timeout, SERVFAIL, REFUSED, unreachable nameserver); the message names query and server."""

    code = "discovery_failed"


class DiscoveryConfig(msgspec.Struct):
    domain: str
    region: str
    nameservers: list[str] = []  # empty: the system resolver (/etc/resolv.conf)
    port: int = 53
    timeout_s: float = 2.0  # per DNS query, all retries included
    probe_timeout_s: float = 2.0
    min_ttl_s: float = 5.0  # floor: a zone with TTL 0 must not make every agent query on every call
    max_ttl_s: float = 300.0  # ceiling: a relay added to DNS is seen within this long
    latency_bucket_ms: float = 5.0

    def __post_init__(self) -> None:
        if not self.domain.strip(".") or not self.region:
            raise ConfigError("discovery needs both a domain and a region")
        if not 0 < self.port < 65536:
            raise ConfigError(f"discovery DNS port {self.port} is not a valid port")
        if self.timeout_s <= 0 or self.probe_timeout_s <= 0:
            raise ConfigError("discovery timeouts must be positive")
        if not 0 <= self.min_ttl_s <= self.max_ttl_s:
            raise ConfigError(f"discovery TTL bounds [{self.min_ttl_s}, {self.max_ttl_s}] are not an interval")
        if self.latency_bucket_ms < 0:
            raise ConfigError("latency_bucket_ms must not be negative")


@dataclass(frozen=True)
class RelayCandidate:
    host: str
    port: int
    region: str
    priority: int
    weight: int
    ttl: float  # seconds; the smallest TTL of its SRV record and its addresses
    addresses: tuple[str, ...] = ()  # from the configured nameservers; empty: leave it to the system resolver

    @property
    def url(self) -> str:
        return f"wss://{self.host}:{self.port}"

    @property
    def endpoint(self) -> tuple[str, int]:
        """What identifies a relay across resolves (TTLs and addresses may change)."""
        return (self.host, self.port)


@dataclass(frozen=True)
class Probe:
    candidate: RelayCandidate
    latency_ms: float | None  # None: unreachable
    error: str = ""


@dataclass(frozen=True)
class _Region:
    """One region's records as read from DNS; ``ttl`` covers the TXT record too (None when there was nothing)."""

    candidates: list[RelayCandidate]
    fallbacks: list[str]
    ttl: float | None


def srv_name(region: str, domain: str) -> str:
    return f"{SRV_LABEL}.{region}.{domain.strip('.')}."


def fallback_name(region: str, domain: str) -> str:
    return f"{FALLBACK_LABEL}.{region}.{domain.strip('.')}."


def parse_fallback(strings: Iterable[bytes], *, own_region: str = "") -> list[str]:
    """The regions of one TXT record (its character-strings), in order, valid and unique."""
    value = b"".join(strings).decode("ascii", errors="replace")
    regions: list[str] = []
    for field_ in value.split():
        key, _, listed = field_.partition("=")
        if key.lower() != FALLBACK_KEY:
            continue
        for name in listed.split(","):
            name = name.strip().lower()
            if _REGION_NAME.match(name) and name != own_region and name not in regions:
                regions.append(name)
    return regions


def rank(probes: Sequence[Probe], *, latency_bucket_ms: float = 0.0, rng: random.Random | None = None) -> list[RelayCandidate]:
    """The alive candidates, best first (see the module docstring); pure unless ``rng`` is given."""
    alive = [p for p in probes if p.latency_ms is not None]

    def key(probe: Probe) -> tuple[int, float, int, float, str, int]:
        c = probe.candidate
        assert probe.latency_ms is not None
        bucket = math.floor(probe.latency_ms / latency_bucket_ms) if latency_bucket_ms > 0 else probe.latency_ms
        return (c.priority, bucket, *_weight_key(c.weight, rng), c.host, c.port)

    return [p.candidate for p in sorted(alive, key=key)]


def _weight_key(weight: int, rng: random.Random | None) -> tuple[int, float]:
    # Sorting by -u**(1/w) is weighted sampling without replacement (Efraimidis-Spirakis): the RFC 2782
    # selection, done in one sort. Weight 0 goes last, shuffled among itself, as RFC 2782 intends.
    if rng is None:
        return (0 if weight > 0 else 1, -float(weight))
    u = rng.random()
    return (0, -(u ** (1.0 / weight))) if weight > 0 else (1, -u)


def demote(ranked: Sequence[RelayCandidate], failed: Sequence[tuple[str, int]]) -> list[RelayCandidate]:
    """``ranked`` with the ``failed`` endpoints moved to the back, in the order they failed."""
    order = {endpoint: i for i, endpoint in enumerate(failed)}
    good = [c for c in ranked if c.endpoint not in order]
    bad = sorted((c for c in ranked if c.endpoint in order), key=lambda c: order[c.endpoint])
    return good + bad


def clamp_ttl(ttls: Iterable[float], *, min_ttl_s: float, max_ttl_s: float) -> float:
    """How long a ranking stays good: the smallest TTL, within [min_ttl_s, max_ttl_s]."""
    smallest = min(ttls, default=min_ttl_s)
    return max(min_ttl_s, min(max_ttl_s, smallest))


async def tcp_connect_latency(candidate: RelayCandidate) -> float:
    """Milliseconds to open a TCP connection to the relay (see the module docstring for why not TLS)."""
    host = candidate.addresses[0] if candidate.addresses else candidate.host
    started = time.perf_counter()
    _, writer = await asyncio.open_connection(host, candidate.port)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    writer.close()
    return elapsed_ms


class RelayDiscovery:
    """Resolves, probes and ranks relays for one agent, and remembers the ranking until its TTL expires."""

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        probe: Callable[[RelayCandidate], Awaitable[float]] | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._probe = probe or tcp_connect_latency
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._resolver = self._make_resolver(config)
        self._ranked: list[RelayCandidate] = []
        self._expires_at = -math.inf
        self._failed: list[tuple[str, int]] = []
        self._lock = asyncio.Lock()

    @staticmethod
    def _make_resolver(config: DiscoveryConfig) -> dns.asyncresolver.Resolver:
        resolver = dns.asyncresolver.Resolver(configure=not config.nameservers)
        if config.nameservers:
            resolver.nameservers = list(config.nameservers)
            resolver.port = config.port
        resolver.lifetime = config.timeout_s
        resolver.timeout = config.timeout_s
        return resolver

    @property
    def nameserver_description(self) -> str:
        servers = ", ".join(str(ns) for ns in self._resolver.nameservers) or "none"
        source = "configured" if self.config.nameservers else "system"
        return f"{source} nameserver(s) {servers} port {self._resolver.port}"

    def expired(self) -> bool:
        return not self._ranked or self._clock() >= self._expires_at

    def mark_failed(self, candidate: RelayCandidate) -> None:
        """A relay that failed on connect goes to the back of the ranking until the next resolve."""
        endpoint = candidate.endpoint
        if endpoint in self._failed:
            self._failed.remove(endpoint)
        self._failed.append(endpoint)

    async def ranked(self, *, force: bool = False) -> list[RelayCandidate]:
        """Relays to dial, best first: the agent's region, else its fallback regions. Cached until a TTL expires."""
        async with self._lock:  # concurrent callers share one resolve instead of each querying DNS
            if force or self.expired():
                ranking, ttls = await self._rank_fresh()
                self._ranked = ranking
                self._failed = []
                self._expires_at = self._clock() + clamp_ttl(
                    ttls, min_ttl_s=self.config.min_ttl_s, max_ttl_s=self.config.max_ttl_s
                )
            return demote(self._ranked, self._failed)

    async def resolve(self, region: str) -> tuple[list[RelayCandidate], list[str]]:
        """The SRV candidates of ``region`` and its fallback regions from TXT; a region without records gives ([], [])."""
        found = await self._resolve_region(region)
        return found.candidates, found.fallbacks

    async def probe_all(self, candidates: Sequence[RelayCandidate]) -> list[Probe]:
        """Every candidate probed concurrently, each bounded by ``probe_timeout_s``."""
        return list(await asyncio.gather(*(self._probe_one(c) for c in candidates)))

    async def _rank_fresh(self) -> tuple[list[RelayCandidate], list[float]]:
        home = await self._resolve_region(self.config.region)
        ttls = _ttls_of([home])
        ranking = await self._rank_region(home.candidates)
        if ranking or not home.fallbacks:
            return ranking, ttls
        log.info(
            "no relay alive in region, trying fallback regions",
            extra={"region": self.config.region, "fallbacks": home.fallbacks},
        )
        fallbacks = await self._gather_or_raise([self._resolve_region(r) for r in home.fallbacks])
        rankings = await asyncio.gather(*(self._rank_region(f.candidates) for f in fallbacks))
        return [c for ranking in rankings for c in ranking], ttls + _ttls_of(fallbacks)

    async def _rank_region(self, candidates: Sequence[RelayCandidate]) -> list[RelayCandidate]:
        probes = await self.probe_all(candidates)
        for probe in probes:
            if probe.latency_ms is None:
                log.info("relay unreachable", extra={"relay": probe.candidate.url, "error": probe.error})
        return rank(probes, latency_bucket_ms=self.config.latency_bucket_ms, rng=self._rng)

    async def _probe_one(self, candidate: RelayCandidate) -> Probe:
        try:
            latency = await asyncio.wait_for(self._probe(candidate), self.config.probe_timeout_s)
        except TimeoutError:
            return Probe(candidate, None, f"no answer within {self.config.probe_timeout_s}s")
        except Exception as exc:  # any failure of any probe means "do not dial this one"; the reason is kept
            return Probe(candidate, None, f"{type(exc).__name__}: {exc}")
        return Probe(candidate, float(latency))

    async def _resolve_region(self, region: str) -> _Region:
        srv, txt = await self._gather_or_raise(
            [
                self._query(srv_name(region, self.config.domain), "SRV"),
                self._query(fallback_name(region, self.config.domain), "TXT"),
            ]
        )
        txt_records = txt.rrset if txt is not None and txt.rrset is not None else None
        fallbacks = parse_fallback((s for rdata in (txt_records or ()) for s in rdata.strings), own_region=region)
        candidates = await self._candidates(region, srv)
        ttls = [c.ttl for c in candidates] + ([float(txt_records.ttl)] if txt_records is not None else [])
        return _Region(candidates, fallbacks, min(ttls, default=None))

    async def _candidates(self, region: str, srv: dns.resolver.Answer | None) -> list[RelayCandidate]:
        if srv is None or srv.rrset is None:
            return []
        srv_ttl = srv.rrset.ttl
        records = [r for r in srv.rrset if r.target.to_text() != "."]
        addresses = await asyncio.gather(*(self._addresses(srv, r.target) for r in records))
        return [
            RelayCandidate(
                host=r.target.to_text(omit_final_dot=True),
                port=int(r.port),
                region=region,
                priority=int(r.priority),
                weight=int(r.weight),
                ttl=float(min([srv_ttl, *ttls])),
                addresses=tuple(found),
            )
            for r, (found, ttls) in zip(records, addresses)
        ]

    async def _addresses(self, srv: dns.resolver.Answer, target: dns.name.Name) -> tuple[list[str], list[float]]:
        """The target's addresses and their TTLs: from the SRV answer's additional section when the server sent
        them (saves two queries per relay), else asked for; a target that does not resolve here gets none."""
        rrsets = [
            rs for rs in srv.response.additional if rs.name == target and rs.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
        ]
        if not rrsets:
            try:
                answers = await self._gather_or_raise([self._query(target.to_text(), "A"), self._query(target.to_text(), "AAAA")])
            except DiscoveryError as exc:  # the probe will try the system resolver; a dead relay is dropped there
                log.warning("relay address lookup failed", extra={"error": str(exc)})
                return [], []
            rrsets = [a.rrset for a in answers if a is not None and a.rrset is not None]
        return [r.to_text() for rs in rrsets for r in rs], [float(rs.ttl) for rs in rrsets]

    async def _query(self, name: str, rdtype: str) -> dns.resolver.Answer | None:
        """One lookup; None when the name or the type does not exist; DiscoveryError when DNS fails."""
        try:
            return await self._resolver.resolve(name, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return None
        except dns.exception.Timeout:
            raise DiscoveryError(
                f"DNS {rdtype} lookup of {name} timed out after {self.config.timeout_s}s asking {self.nameserver_description}"
            ) from None
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"DNS {rdtype} lookup of {name} failed asking {self.nameserver_description}: {exc}") from exc

    @staticmethod
    async def _gather_or_raise(aws: Sequence[Awaitable[_T]]) -> list[_T]:
        # return_exceptions lets every lookup finish (no orphaned task errors); the first failure is then raised.
        results = await asyncio.gather(*aws, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]


def _ttls_of(regions: Iterable[_Region]) -> list[float]:
    return [r.ttl for r in regions if r.ttl is not None]
