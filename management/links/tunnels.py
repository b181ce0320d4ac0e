"""One renter-access tunnel per open link, shared by every request to it, and an HTTP client over it.

A ``LinkTunnel`` holds a ``port`` tunnel (common/tunnel.py) to the link's container and a Unix socket listener in a
directory only the Master's user may enter; every connection accepted there rides the tunnel as a stream of its own
(OPEN, DATA both ways, CLOSE), exactly as ``idlegrid workload port-forward`` does with TCP. An ``aiohttp`` client
session bound to that socket then speaks HTTP/1.1 and WebSockets to the container, so the proxy needs no HTTP code
of its own. ``connections_per_link`` bounds the client's connections, hence the streams on the host.

``LinkTunnels`` keeps them by link: opened at the first request, replaced when the tunnel ended (a relay restarted,
the replica moved), closed when unused for ``idle_close_s`` so the host's tunnel slot is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from common.tokenbucket import TokenBucket
from common.tunnel import MAX_TUNNEL_PAYLOAD, Op
from management.client.tunnel import Tunnel, TunnelClosed, TunnelGrant
from management.links.names import LinkAddress

log = logging.getLogger(__name__)

OpenGrant = Callable[[LinkAddress], Awaitable[TunnelGrant]]


class LinkTunnel:
    """A tunnel to one link's container, with ``session``: an HTTP client whose connections are its streams."""

    def __init__(self, address: LinkAddress, tunnel: Tunnel, socket_path: Path, connections: int, bytes_per_s: int = 0) -> None:
        self.address = address
        # One bucket each way (0: unpaced here); a debt of up to a twentieth of a second's bytes, at least 4 frames.
        burst = max(4 * MAX_TUNNEL_PAYLOAD, bytes_per_s // 20)
        now = time.monotonic()
        self._down = TokenBucket(bytes_per_s, burst, now) if bytes_per_s else None
        self._up = TokenBucket(bytes_per_s, burst, now) if bytes_per_s else None
        self._tunnel = tunnel
        self._path = socket_path
        self._streams: dict[int, asyncio.StreamWriter] = {}
        self._next_stream = 1
        self._server: asyncio.AbstractServer | None = None
        self._pump: asyncio.Task[None] | None = None
        self.session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(socket_path), limit=connections),
            auto_decompress=False,  # bodies pass as the container sent them, Content-Encoding and all
            # The session is shared by every visitor of the link: a jar would keep one visitor's cookies (whatever the
            # container set for them) and send them on everyone's requests. Cookies are the visitors' browsers' only.
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        self.in_use = 0  # requests being served now
        self.last_used = time.monotonic()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accepted, path=str(self._path))
        self._path.chmod(0o600)
        self._pump = asyncio.create_task(self._from_agent(), name=f"link-{self.address.name}")

    @property
    def alive(self) -> bool:
        return self._pump is not None and not self._pump.done()

    def why(self) -> str:
        return self._tunnel.why()

    async def _from_agent(self) -> None:
        """Frames from the agent, to the local connection of their stream, until the tunnel ends."""
        while (frame := await self._tunnel.receive()) is not None:
            writer = self._streams.get(frame.stream)
            if writer is None:
                if frame.op is Op.ERROR and frame.stream == 0:
                    log.warning("link %s: the agent refused the tunnel: %s", self.address.name, frame.payload[:200])
                continue
            if frame.op is Op.DATA:
                writer.write(frame.payload)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                # A receive or a drain that needs no wait returns without yielding: without this, a busy link would
                # hold the Master's loop (relay links, API calls) for as long as its bytes keep coming.
                await _pace(self._down, len(frame.payload))
            elif frame.op is Op.EOF:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
            elif frame.op in (Op.CLOSE, Op.ERROR):
                if frame.op is Op.ERROR:
                    log.info("link %s stream %d: %s", self.address.name, frame.stream, frame.payload[:200])
                self._streams.pop(frame.stream, None)
                writer.close()
        for writer in self._streams.values():
            writer.close()
        self._streams.clear()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = self._next_stream
        self._next_stream += 1
        self._streams[stream] = writer
        try:
            await self._tunnel.send(Op.OPEN, stream)
            while data := await reader.read(MAX_TUNNEL_PAYLOAD):
                await self._tunnel.send(Op.DATA, stream, data)
                await _pace(self._up, len(data))  # as in _from_agent: a busy link never holds up the Master's other work
            # The HTTP client never half-closes: its end of file is the connection's end, so the stream is over.
            if self._streams.pop(stream, None) is not None:
                await self._tunnel.send(Op.CLOSE, stream)
        except (TunnelClosed, ConnectionError):
            self._streams.pop(stream, None)
        finally:
            writer.close()

    async def close(self) -> None:
        await self.session.close()
        if self._server is not None:
            self._server.close()
        await self._tunnel.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()


async def _pace(bucket: TokenBucket | None, size: int) -> None:
    """Charge ``size`` bytes and wait out any debt; always yields to the loop at least once."""
    wait = 0.0
    if bucket is not None:
        now = time.monotonic()
        bucket.charge(now, size)
        wait = bucket.wait_s(now, 0)
    await asyncio.sleep(wait)


class LinkTunnels:
    """The open links' tunnels, by link; at most one per link, opened on demand (``get``), swept when idle."""

    def __init__(self, open_grant: OpenGrant, *, connections: int, idle_close_s: float, bytes_per_s: int = 0) -> None:
        self._open_grant = open_grant
        self._bytes_per_s = bytes_per_s
        self._connections = connections
        self._idle_close_s = idle_close_s
        self._open: dict[LinkAddress, LinkTunnel] = {}
        self._opening: dict[LinkAddress, asyncio.Lock] = {}
        self._dir: Path | None = None

    async def get(self, address: LinkAddress) -> LinkTunnel:
        """The link's tunnel, opened now when there is none alive; TunnelClosed (or the grant's refusal) otherwise."""
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:  # concurrent first requests open one tunnel, not one each
            current = self._open.get(address)
            if current is not None and current.alive:
                return current
            if current is not None:
                self._open.pop(address, None)
                await current.close()
            grant = await self._open_grant(address)
            tunnel = await Tunnel.open(grant)
            path = self._socket_dir() / f"{address.name}.sock"
            link = LinkTunnel(address, tunnel, path, self._connections, self._bytes_per_s)
            await link.start()
            self._open[address] = link
            log.info("link %s: tunnel %s open through relay %s", address.name, grant.id, grant.relay_id)
            return link

    def _socket_dir(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="idlegrid-links-"))  # 0700: the Master's user alone gets in
        return self._dir

    async def sweep(self, now: float | None = None) -> int:
        """Close tunnels unused for ``idle_close_s`` and dead ones; how many were closed."""
        now = time.monotonic() if now is None else now
        done = [
            link
            for link in self._open.values()
            if not link.alive or (link.in_use == 0 and now - link.last_used > self._idle_close_s)
        ]
        for link in done:
            self._open.pop(link.address, None)
            self._opening.pop(link.address, None)
            await link.close()
        return len(done)

    async def close_workload(self, workload_id: str) -> None:
        for address in [a for a in self._open if a.workload == workload_id]:
            await self._open.pop(address).close()

    async def close(self) -> None:
        for link in list(self._open.values()):
            await link.close()
        self._open.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __len__(self) -> int:
        return len(self._open)
