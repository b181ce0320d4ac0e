"""The renter's end of a tunnel (common/tunnel.py): one WebSocket to the relay a ``TunnelGrant`` names.

Used by the CLI (``idlegrid workload logs|exec|port-forward``) and by the Master itself where it bridges a browser's
terminal or an HTTP client's logs to a tunnel (the browser cannot trust the platform CA, the Master can).
"""

from __future__ import annotations

import ssl
from types import TracebackType

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from common.errors import IdlegridError
from common.tunnel import HEADER, MAX_TUNNEL_PAYLOAD, TICKET_HEADER, Op, TunnelFrame, decode_frame, encode_frame

CONNECT_TIMEOUT_S = 10.0


class TunnelGrant(msgspec.Struct, kw_only=True):
    """Where and with what to connect: dial ``url`` with ``ticket`` in the X-Idlegrid-Ticket header, trusting
    ``ca_pem`` (the platform CA) for the relay's certificate, before ``expires_at``."""

    id: str
    kind: str
    workload: str
    agent_id: str
    relay_id: str
    url: str  # wss://RELAY/tunnel
    ticket: str
    ca_pem: str
    expires_at: float


class TunnelClosed(IdlegridError):
    """The tunnel could not open, or ended; the message says why (the relay's close reason when it gave one)."""

    code = "tunnel_closed"


def _tls_for(grant: TunnelGrant) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=grant.ca_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class Tunnel:
    """``async with await Tunnel.open(grant) as tunnel:`` then ``send`` frames and ``receive`` them until ``None``."""

    def __init__(self, connection: ClientConnection) -> None:
        self._ws = connection
        self.close_code: int | None = None
        self.close_reason = ""

    @classmethod
    async def open(cls, grant: TunnelGrant, *, timeout_s: float = CONNECT_TIMEOUT_S) -> Tunnel:
        try:
            connection = await connect(
                grant.url,
                ssl=_tls_for(grant),
                additional_headers={TICKET_HEADER: grant.ticket},
                open_timeout=timeout_s,
                max_size=HEADER.size + MAX_TUNNEL_PAYLOAD,
                compression=None,
                ping_interval=20,
            )
        except InvalidStatus as exc:
            raise TunnelClosed(f"the relay refused the tunnel: HTTP {exc.response.status_code}") from None
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise TunnelClosed(f"cannot reach the relay at {grant.url}: {exc}") from None
        return cls(connection)

    async def send(self, op: Op, stream: int = 0, payload: bytes = b"") -> None:
        try:
            await self._ws.send(encode_frame(op, stream, payload))
        except ConnectionClosed as exc:
            self._closed(exc)
            raise TunnelClosed(self.why()) from None

    async def receive(self) -> TunnelFrame | None:
        """The next frame from the agent; ``None`` once the tunnel has closed (``close_code``/``why()`` say how)."""
        try:
            message = await self._ws.recv()
        except ConnectionClosed as exc:
            self._closed(exc)
            return None
        if isinstance(message, str):
            message = message.encode()
        return decode_frame(message)

    def why(self) -> str:
        if self.close_code in (None, 1000):
            return "the tunnel ended"
        return f"the tunnel closed ({self.close_code}): {self.close_reason or 'no reason given'}"

    def _closed(self, exc: ConnectionClosed) -> None:
        frame = exc.rcvd or exc.sent
        if frame is not None and self.close_code is None:
            self.close_code, self.close_reason = frame.code, frame.reason

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self) -> Tunnel:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()
