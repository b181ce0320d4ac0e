"""The relay directory: every relay the agent may fail over to when DNS gives it nothing better.

Where it comes from: the Master sends every linked relay (``RelayEntry``: relay id, region, URL) in the enrollment
answer, in ``welcome`` and in a ``relay_directory`` frame whenever a relay comes or goes. The agent keeps the latest
one in ``<state_dir>/relays.json`` (0600), so a restarted agent still knows where to go while its own relay is down.
The relays the agent was configured with or enrolled through are always candidates too, even when the Master's
directory no longer names them (they may be the only ones this host can reach).

How it is ranked (``rank_relays``, pure): relays the operator named (``--access``) first, in the order given: an
explicit choice is kept, and the directory is where the agent goes when they fail. Then the agent's home region, then
the other regions; inside each, by
measured latency in buckets (as agent/discovery.py ranks DNS candidates, so a few milliseconds of noise do not pile
every agent onto one relay); relays the probe could not reach come last, still tried (a relay that just restarted
may refuse a probe and accept the next connection). Ties keep the directory's order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from agent.state import PRIVATE_FILE_MODE
from common.errors import ConfigError
from common.files import write_atomically
from common.wire import RelayEntry

log = logging.getLogger(__name__)

DIRECTORY_FILE = "relays.json"
WSS_PORT = 443


def merge_relays(directory: Iterable[RelayEntry], static_urls: Iterable[str]) -> list[RelayEntry]:
    """The Master's directory, then the configured relays it does not name (region unknown), one entry per URL."""
    merged: dict[str, RelayEntry] = {}
    for entry in directory:
        merged.setdefault(entry.url, entry)
    for url in static_urls:
        merged.setdefault(url, RelayEntry(relay_id="", region="", url=url))
    return list(merged.values())


def rank_relays(
    relays: Sequence[RelayEntry],
    latencies_ms: Mapping[str, float | None],
    *,
    home_region: str,
    latency_bucket_ms: float = 0.0,
    preferred_urls: Sequence[str] = (),
) -> list[RelayEntry]:
    """``relays`` best first: ``preferred_urls`` in their order, then home region, then the others; by latency
    bucket; unreachable last (see the docstring)."""
    preferred = {url: rank for rank, url in enumerate(preferred_urls)}

    def key(indexed: tuple[int, RelayEntry]) -> tuple[int, int, int, float, int]:
        position, entry = indexed
        latency = latencies_ms.get(entry.url)
        chosen = preferred.get(entry.url, len(preferred))
        away = 0 if home_region and entry.region == home_region else 1
        if latency is None:
            return (1, chosen, away, math.inf, position)
        bucket = math.floor(latency / latency_bucket_ms) if latency_bucket_ms > 0 else latency
        return (0, chosen, away, bucket, position)

    return [entry for _, entry in sorted(enumerate(relays), key=key)]


def relay_address(url: str) -> tuple[str, int]:
    """(host, port) of a ``wss://`` URL, for the latency probe."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ConfigError(f"relay URL {url!r} names no host; expected wss://HOST:PORT")
    return parts.hostname, parts.port or WSS_PORT


async def tcp_latency_ms(url: str) -> float:
    """Milliseconds to open a TCP connection to the relay at ``url`` (why TCP, not TLS: agent/discovery.py)."""
    host, port = relay_address(url)
    started = time.perf_counter()
    _, writer = await asyncio.open_connection(host, port)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    writer.close()
    return elapsed_ms


async def probe_relays(
    relays: Sequence[RelayEntry], probe: Callable[[str], Awaitable[float]], *, timeout_s: float
) -> dict[str, float | None]:
    """Latency of every relay at once, None for one that did not answer within ``timeout_s``."""

    async def one(url: str) -> float | None:
        try:
            return await asyncio.wait_for(probe(url), timeout_s)
        except (OSError, TimeoutError, ConfigError):
            return None

    latencies = await asyncio.gather(*(one(entry.url) for entry in relays))
    return {entry.url: latency for entry, latency in zip(relays, latencies, strict=True)}


def load_directory(state_dir: Path) -> list[RelayEntry]:
    """The directory the Master last sent, or none yet. An unreadable file is logged and ignored: it is a cache of
    what the Master sends again at the next welcome, and the configured relays still get the agent there."""
    path = state_dir / DIRECTORY_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[RelayEntry])
    except FileNotFoundError:
        return []
    except (OSError, msgspec.DecodeError) as exc:
        log.warning(
            "ignoring an unreadable relay directory; the Master sends it again",
            extra={"path": str(path), "error": str(exc)},
        )
        return []


def save_directory(state_dir: Path, relays: Sequence[RelayEntry]) -> None:
    write_atomically(state_dir / DIRECTORY_FILE, msgspec.json.encode(list(relays)), mode=PRIVATE_FILE_MODE)


class DirectoryStore(Protocol):
    """Where an agent keeps the Master's relay directory between runs (the fleet bench keeps it in memory)."""

    def load(self) -> list[RelayEntry]: ...

    async def save(self, relays: Sequence[RelayEntry]) -> None: ...


class DirectoryFile:
    """The directory in the agent's state directory (``DIRECTORY_FILE``, 0600).

    Written in a worker thread: an fsynced write must not stall the link (in the fleet bench, where agents share a
    process, it was a quarter of the ramp's samples). One write at a time, each of the latest directory, so an older
    one never lands last."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._latest: list[RelayEntry] = []
        self._saving = asyncio.Lock()

    def load(self) -> list[RelayEntry]:
        return load_directory(self.state_dir)

    async def save(self, relays: Sequence[RelayEntry]) -> None:
        self._latest = list(relays)
        async with self._saving:  # first come, first served
            await asyncio.to_thread(save_directory, self.state_dir, self._latest)
