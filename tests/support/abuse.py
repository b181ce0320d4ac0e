"""Hostile clients for abuse tests: raw TCP and half-done TLS against a relay's agent port, with bounded concurrency.

Each thrower returns how its attempts ended, so a test can print what it threw and assert what held.
Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

Outcomes = Counter[str]


def client_hello(server_name: str = "localhost") -> bytes:
    """The bytes of a real TLS ClientHello, made in memory: what a slow or truncated handshake starts with."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc (Linux), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


async def how_it_ended(reader: asyncio.StreamReader, timeout: float) -> str:
    """Read until the server ends the connection: ``reset``, ``closed`` (EOF or a TLS alert then EOF), or ``open``."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(4096):
                pass
        return "closed"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except TimeoutError:
        return "open"


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_tcp(
    port: int, timeout: float = 5.0, *, source: str | None = None, tls: ssl.SSLContext | None = None
) -> Connection | str:
    """A TCP (or TLS) connection, or how connecting failed: ``reset`` (the server accepted and reset at once, often
    before the client's connect() returned), ``refused``, ``tls_failed`` or ``timeout``.

    ``source`` picks the client's loopback address (any of 127.0.0.0/8 on Linux), so a test can be several clients.
    """
    local = (source, 0) if source else None
    try:
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=local, ssl=tls), timeout)
    except ssl.SSLError:
        return "tls_failed"
    except ConnectionResetError:
        return "reset"
    except OSError:
        return "refused"
    except TimeoutError:
        return "timeout"


async def throw(port: int, payload: bytes, *, wait_s: float = 3.0, source: str | None = None) -> str:
    """Connect, send ``payload`` at once, and report how the server ended it."""
    opened = await open_tcp(port, source=source)
    if isinstance(opened, str):
        return opened
    reader, writer = opened
    try:
        with contextlib.suppress(OSError):
            writer.write(payload)
            await writer.drain()
        return await how_it_ended(reader, wait_s)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def dribble(port: int, payload: bytes, *, every_s: float, wait_s: float, source: str | None = None) -> tuple[str, float]:
    """Send ``payload`` one byte at a time (slowloris); how the server ended it and after how many seconds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    opened = await open_tcp(port, source=source)
    if isinstance(opened, str):
        return opened, loop.time() - started
    reader, writer = opened
    ended = asyncio.create_task(how_it_ended(reader, wait_s))
    try:
        for byte in payload:
            if ended.done():
                break
            with contextlib.suppress(OSError):
                writer.write(bytes([byte]))
                await writer.drain()
            await asyncio.sleep(every_s)
        return await ended, loop.time() - started
    finally:
        ended.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def bounded(count: int, concurrency: int, attempt: Callable[[int], Awaitable[str]]) -> Outcomes:
    """Run ``attempt(i)`` for i in range(count), at most ``concurrency`` at once; tally the outcomes."""
    outcomes: Outcomes = Counter()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            try:
                outcomes[await attempt(i)] += 1
            except Exception as exc:  # an attempt failing oddly is an outcome worth reporting, not a test crash
                outcomes[type(exc).__name__] += 1

    await asyncio.gather(*(one(i) for i in range(count)))
    return outcomes


def random_bytes(size: int) -> bytes:
    return os.urandom(size)


async def tls_without_certificate(port: int, context: ssl.SSLContext, *, source: str | None = None) -> str:
    """A TLS client that trusts the relay but has no certificate of its own: how the relay turned it away."""
    opened = await open_tcp(port, source=source, tls=context)
    if isinstance(opened, str):
        return opened
    reader, writer = opened  # TLS 1.3: the client finishes before the server has judged its (missing) certificate
    try:
        with contextlib.suppress(OSError):
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            ended = await how_it_ended(reader, 3.0)
        except ssl.SSLError:
            ended = "tls_failed"
        return "tls_failed" if ended == "closed" else ended
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
