"""The Master's WebSocket endpoint for Access relays: mutual TLS, role ``access`` only, frames per agent."""

from __future__ import annotations

import asyncio
import http
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from common.errors import PKIError, ProtocolError
from common.pki import CertRole, peer_identity
from common.wire import (
    CLOSE_NOT_LEADER,
    CLOSE_POLICY,
    HARD_FRAME_BYTES,
    AccessHello,
    AccessWelcome,
    ErrorCode,
    LinkFrame,
    Relay,
    decode_link_frame,
    decode_link_message,
    encode,
    error_frame,
    negotiate,
)

log = logging.getLogger(__name__)

# Only relays dial this endpoint. TLS, the upgrade and the first frame each get this long (websockets applies
# open_timeout to TLS as well), so a peer that stalls anywhere in the opening is dropped.
OPEN_TIMEOUT_S = 10.0


@dataclass(eq=False)
class AccessLink:
    """One connected Access relay."""

    relay_id: str
    region: str
    connection: ServerConnection
    public_url: str = ""  # where agents dial this relay (its AccessHello says), "" when it did not say
    http_url: str = ""  # where renters reach its HTTPS port (tunnels), "" when it did not say
    agents: set[str] = field(default_factory=set)

    async def send(self, data: bytes) -> bool:
        try:
            await self.connection.send(data, text=True)
            return True
        except ConnectionClosed:
            return False

    async def send_to_agent(self, agent_id: str, frame: bytes) -> bool:
        return await self.send(encode(Relay(agent_id=agent_id, frame=msgspec.Raw(frame))))


LinkHandler = Callable[[AccessLink, LinkFrame], Awaitable[None]]
LinkEvent = Callable[[AccessLink], Awaitable[None]]


class RelayHub:
    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        on_frame: LinkHandler,
        on_close: LinkEvent,
        revoked: Callable[[], list[str]],
        on_open: LinkEvent | None = None,
        refusal: Callable[[], str | None] | None = None,
    ) -> None:
        self._ssl = ssl_context
        self._on_frame = on_frame
        self._on_close = on_close
        self._on_open = on_open
        self._revoked = revoked
        # None while this Master leads (or runs alone); else the leader's link URL ("" when unknown): relays are refused
        # with CLOSE_NOT_LEADER and it as the reason (docs/ha.md).
        self._refusal = refusal
        self.links: dict[str, AccessLink] = {}
        self.agent_links: dict[str, AccessLink] = {}
        self._server: Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await serve(
            self._serve_link,
            host,
            port,
            ssl=self._ssl,
            max_size=HARD_FRAME_BYTES,
            max_queue=64,
            compression=None,
            open_timeout=OPEN_TIMEOUT_S,
            process_request=_only_relays,
        )
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def send_to_agent(self, agent_id: str, frame: bytes) -> bool:
        link = self.agent_links.get(agent_id)
        return link is not None and await link.send_to_agent(agent_id, frame)

    async def broadcast(self, data: bytes) -> None:
        await asyncio.gather(*(link.send(data) for link in list(self.links.values())))

    async def close_links(self, code: int, reason: str) -> None:
        """Close every relay link (a Master stepping down: ``CLOSE_NOT_LEADER``, the new leader's URL)."""
        await asyncio.gather(*(link.connection.close(code, reason) for link in list(self.links.values())))

    async def _serve_link(self, connection: ServerConnection) -> None:
        leader = self._refusal() if self._refusal is not None else None
        if leader is not None:
            log.debug("relay link refused: not the leader", extra={"leader": leader})
            await connection.close(CLOSE_NOT_LEADER, leader)
            return
        link = await self._open(connection)
        if link is None:
            return
        leader = self._refusal() if self._refusal is not None else None
        if leader is not None:  # stepped down while this link was opening
            await connection.close(CLOSE_NOT_LEADER, leader)
        if self._on_open is not None:
            await self._on_open(link)
        try:
            while True:
                # bytes: msgspec reads UTF-8 itself, so websockets need not decode a batch to str first
                await self._receive(link, await connection.recv(decode=False))
        except ConnectionClosed:
            pass
        finally:
            if self.links.get(link.relay_id) is link:
                del self.links[link.relay_id]
            await self._on_close(link)  # which also forgets the agents this link still spoke for
            log.info("access relay disconnected", extra={"relay": link.relay_id})

    async def _open(self, connection: ServerConnection) -> AccessLink | None:
        try:
            identity = peer_identity(connection.transport.get_extra_info("ssl_object"))
            if identity.role is not CertRole.ACCESS:
                raise PKIError(f"certificate role {identity.role.value!r} may not open a relay link")
            hello = decode_link_frame(await asyncio.wait_for(connection.recv(), timeout=OPEN_TIMEOUT_S))
            if not isinstance(hello, AccessHello):
                raise ProtocolError("the first frame on a relay link must be access_hello", code=ErrorCode.UNEXPECTED_FRAME.value)
            version = negotiate(hello.versions)
        except (PKIError, ProtocolError) as exc:
            log.warning("relay link refused: %s", exc)
            await connection.close(CLOSE_POLICY, str(exc)[:120])
            return None
        except (TimeoutError, ConnectionClosed):
            return None
        if identity.id != hello.relay_id:
            log.warning("relay %s announced itself as %s; using the certificate's name", identity.id, hello.relay_id)
        link = AccessLink(
            relay_id=identity.id,
            region=hello.region,
            connection=connection,
            public_url=hello.public_url,
            http_url=hello.http_url,
        )
        old = self.links.get(link.relay_id)
        if old is not None:
            await old.connection.close(CLOSE_POLICY, "replaced by a newer link")
        self.links[link.relay_id] = link
        await link.send(encode(AccessWelcome(version=version, revoked_serials=self._revoked(), batches=True)))
        log.info("access relay connected", extra={"relay": link.relay_id, "region": link.region})
        return link

    async def _receive(self, link: AccessLink, message: str | bytes) -> None:
        """One message: a frame, or a relay's batch of them, handled in order."""
        for frame in decode_link_message(message):
            if isinstance(frame, ProtocolError):
                log.warning("bad frame from relay %s: %s", link.relay_id, frame)
                await link.send(error_frame(frame))
                continue
            try:
                await self._on_frame(link, frame)
            except Exception:  # one bad frame must not take the link down for every agent behind it
                log.exception("failed to handle %s frame from relay %s", type(frame).__name__, link.relay_id)


def _only_relays(connection: ServerConnection, request: Request) -> Response | None:
    """Refuse any certificate but a relay's before the upgrade: an agent's certificate is valid TLS here too."""
    try:
        role = peer_identity(connection.transport.get_extra_info("ssl_object")).role
    except PKIError as exc:
        log.warning("relay link refused: %s", exc)
        return connection.respond(http.HTTPStatus.FORBIDDEN, "a relay certificate is required\n")
    if role is not CertRole.ACCESS:
        log.warning("relay link refused: certificate role %r", role.value)
        return connection.respond(http.HTTPStatus.FORBIDDEN, f"certificate role {role.value!r} may not open a relay link\n")
    return None
