"""Renter access through the relays: the ticket that opens a tunnel, and the frames a tunnel carries.

Hosts never listen. A renter who wants a container's logs, a shell in it or one of its ports asks the API,
which checks ownership and mints a ``Ticket``: a ``TicketBody`` signed by the Master's command-signing key
(Ed25519), carrying that key and the platform CA's endorsement of it, so a relay that holds only the CA
certificate can check it. The Master sends the same ticket to the agent over its control link
(``common.wire.TunnelOpen``); the agent dials a separate data WebSocket to the relay the ticket names
(``/tunnel/<id>`` on the relay's agent port, with its client certificate), the renter dials the relay's
HTTPS port (``/tunnel``), both presenting the ticket in the ``X-Idlegrid-Ticket`` header. The relay checks the
ticket on both sides, pairs them by ticket id (each side once), and passes binary messages between them
untouched, within the tunnel's bandwidth. Bulk bytes never travel on the control link.

Every binary message of a tunnel is one ``TunnelFrame``: an op byte, a stream id (4 bytes, big-endian) and a
payload of at most ``MAX_TUNNEL_PAYLOAD`` bytes. ``exec`` and ``logs`` use stream 0; ``port`` opens one stream per
TCP connection the renter's side accepts. Pure codec, no I/O, so both ends and the tests share it.
"""

from __future__ import annotations

import base64
import binascii
import enum
import secrets
import struct
from typing import TYPE_CHECKING, Annotated

import msgspec

from common.errors import IdlegridError, ProtocolError, SignatureError

if TYPE_CHECKING:  # the frames and tickets' shapes need no cryptography: the renter's CLI reads frames only
    from cryptography import x509

    from common.pki import CommandSigner, CommandVerifier

TICKET_HEADER = "X-Idlegrid-Ticket"
RENTER_PATH = "/tunnel"  # on the relay's HTTPS port
AGENT_PATH_PREFIX = "/tunnel/"  # + ticket id, on the relay's agent port (mutual TLS)
TICKET_ID_PREFIX = "tun-"
MAX_TICKET_CHARS = 6 * 1024  # a header line: the relays' HTTP servers take about 8 KiB
MAX_TUNNEL_PAYLOAD = 64 * 1024
HEADER = struct.Struct(">BI")  # op, stream id
MAX_COMMAND_ARGS = 64
MAX_SSH_KEYS = 20  # kind ssh: the fingerprints of the keys that may log in (an account's, at most this many)


class TunnelKind(str, enum.Enum):
    LOGS = "logs"  # the container's output: the last ``tail`` lines, then more while ``follow``
    EXEC = "exec"  # a command in the container, a terminal when ``tty``; its exit status ends the tunnel
    PORT = "port"  # TCP connections to the container's ``port``, one stream each
    SSH = "ssh"  # an SSH connection whose server end is the agent (docs/ssh.md); DATA on stream 0 carries its bytes


class TicketRefused(IdlegridError):
    """A ticket that does not open this tunnel here: malformed, forged, expired, for another relay or agent."""

    code = "ticket_refused"


ShortText = Annotated[str, msgspec.Meta(max_length=256)]
Arg = Annotated[str, msgspec.Meta(max_length=4096)]


class TicketBody(msgspec.Struct, kw_only=True, frozen=True):
    """What the Master signs: who may open which tunnel to which container, where, until when."""

    id: ShortText  # "tun-<hex>": the pairing key at the relay, and the audit event's subject
    kind: str  # a TunnelKind value
    account: ShortText  # who asked (the workload's owner, or an operator)
    workload: ShortText
    agent_id: ShortText  # the host that serves it
    container: ShortText  # the container's name on that host
    relay_id: ShortText  # the relay where both ends meet (the one the agent is linked through)
    issued_at: float
    expires_at: float  # both ends must have arrived at the relay before this
    key_id: ShortText  # the command-signing key that signed it
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0  # kind port
    command: Annotated[list[Arg], msgspec.Meta(max_length=MAX_COMMAND_ARGS)] = []  # kind exec
    tty: bool = False  # kind exec
    cols: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0  # kind exec with tty: the first size
    rows: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    tail: Annotated[int, msgspec.Meta(ge=-1)] = 100  # kind logs: lines from the end, -1 for all
    follow: bool = False  # kind logs
    bytes_per_s: Annotated[int, msgspec.Meta(ge=0)] = 0  # the tunnel's bandwidth each way; 0: the relay's default
    # kind ssh: the OpenSSH fingerprints (SHA256:...) of the public keys the agent's SSH end lets in: the account's
    ssh_keys: Annotated[list[ShortText], msgspec.Meta(max_length=MAX_SSH_KEYS)] = []


class Ticket(msgspec.Struct, kw_only=True, frozen=True):
    body: TicketBody
    signature: str  # Ed25519 over ticket_signing_bytes(body), base64
    public_key: str  # the signing key, base64 raw Ed25519, so a relay without the key ring can check it
    endorsement: str  # the platform CA's signature over public_key (common.pki.verify_key_endorsement)


_ticket_decoder = msgspec.json.Decoder(Ticket)


def new_ticket_id() -> str:
    return TICKET_ID_PREFIX + secrets.token_hex(12)


def ticket_signing_bytes(body: TicketBody) -> bytes:
    """Canonical bytes a ticket's signature covers (sorted keys; a prefix so no command body can pass for one)."""
    return b"idlegrid tunnel ticket\0" + msgspec.json.encode(body, order="sorted")


def sign_ticket(body: TicketBody, signer: CommandSigner, endorsement: str) -> Ticket:
    if body.key_id != signer.key_id:
        raise ValueError(f"ticket names key {body.key_id!r} but is signed with {signer.key_id!r}")
    return Ticket(
        body=body,
        signature=signer.sign(ticket_signing_bytes(body)),
        public_key=signer.public_key_b64(),
        endorsement=endorsement,
    )


def encode_ticket(ticket: Ticket) -> str:
    """The ticket as one header value (URL-safe base64 of its JSON)."""
    return base64.urlsafe_b64encode(msgspec.json.encode(ticket)).decode("ascii")


def decode_ticket(text: str) -> Ticket:
    if not text or len(text) > MAX_TICKET_CHARS:
        raise TicketRefused(f"a ticket is 1 to {MAX_TICKET_CHARS} characters, got {len(text)}")
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
        ticket = _ticket_decoder.decode(raw)
    except (binascii.Error, ValueError, UnicodeError, msgspec.DecodeError) as exc:
        raise TicketRefused(f"not a ticket: {exc}") from None
    if ticket.body.kind not in {k.value for k in TunnelKind}:
        raise TicketRefused(f"unknown tunnel kind {ticket.body.kind!r}")
    return ticket


def _check_common(body: TicketBody, now: float) -> None:
    if now >= body.expires_at:
        raise TicketRefused(f"ticket {body.id} expired {now - body.expires_at:.0f} s ago; ask the API for a new one")


def verify_at_relay(ticket: Ticket, ca_cert: x509.Certificate, relay_id: str, now: float) -> None:
    """What a relay checks before it lets either end in: the CA endorsed the key, the key signed the body, the
    ticket is for this relay and not expired. Raises ``TicketRefused`` saying which."""
    from common.pki import CommandVerifier, verify_key_endorsement

    try:
        verify_key_endorsement(ca_cert, ticket.public_key, ticket.endorsement)
        verifier = CommandVerifier({ticket.body.key_id: ticket.public_key})
        verifier.verify(ticket.body.key_id, ticket_signing_bytes(ticket.body), ticket.signature)
    except SignatureError as exc:
        raise TicketRefused(f"ticket {ticket.body.id}: {exc}") from None
    if ticket.body.relay_id != relay_id:
        raise TicketRefused(f"ticket {ticket.body.id} is for relay {ticket.body.relay_id!r}, this is {relay_id!r}")
    _check_common(ticket.body, now)


def verify_at_agent(ticket: Ticket, verifier: CommandVerifier, agent_id: str, now: float) -> None:
    """What an agent checks before it dials: a key it trusts for commands signed it, for this agent, not expired."""
    try:
        verifier.verify(ticket.body.key_id, ticket_signing_bytes(ticket.body), ticket.signature)
    except SignatureError as exc:
        raise TicketRefused(f"ticket {ticket.body.id}: {exc}") from None
    if ticket.body.agent_id != agent_id:
        raise TicketRefused(f"ticket {ticket.body.id} is for agent {ticket.body.agent_id!r}, not {agent_id!r}")
    _check_common(ticket.body, now)


# --- frames inside a tunnel ------------------------------------------------------------------


class Op(enum.IntEnum):
    DATA = 1  # bytes: stdin (renter -> agent), stdout or the logs (agent -> renter), a TCP stream's bytes
    STDERR = 2  # agent -> renter: a command's or the container's standard error (no tty)
    OPEN = 3  # renter -> agent, kind port: open stream N to the container's port
    EOF = 4  # "no more bytes from me on stream N" (stdin closed; a TCP half-close); the other way may go on
    CLOSE = 5  # stream N is over, both ways; payload: an optional UTF-8 reason
    RESIZE = 6  # renter -> agent, kind exec with tty: payload JSON {"cols": int, "rows": int}
    EXIT = 7  # agent -> renter: payload JSON {"code": int}; the command (or a logs tunnel without follow) ended
    ERROR = 8  # agent -> renter: payload UTF-8 message a person can act on (no such port, container gone)


class TunnelFrame(msgspec.Struct, frozen=True):
    op: Op
    stream: int
    payload: bytes = b""


class Resize(msgspec.Struct, frozen=True):
    cols: Annotated[int, msgspec.Meta(ge=1, le=1000)]
    rows: Annotated[int, msgspec.Meta(ge=1, le=1000)]


class ExitStatus(msgspec.Struct, frozen=True):
    code: int


def encode_frame(op: Op, stream: int = 0, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_TUNNEL_PAYLOAD:
        raise ValueError(f"a tunnel frame carries at most {MAX_TUNNEL_PAYLOAD} bytes, got {len(payload)}")
    return HEADER.pack(op, stream) + payload


def decode_frame(message: bytes) -> TunnelFrame:
    """One binary message of a tunnel; a malformed one raises ``ProtocolError``."""
    if len(message) < HEADER.size:
        raise ProtocolError(f"tunnel frame of {len(message)} bytes is shorter than its {HEADER.size}-byte header")
    if len(message) > HEADER.size + MAX_TUNNEL_PAYLOAD:
        raise ProtocolError(f"tunnel frame carries {len(message) - HEADER.size} bytes, over {MAX_TUNNEL_PAYLOAD}")
    op, stream = HEADER.unpack_from(message)
    try:
        kind = Op(op)
    except ValueError:
        raise ProtocolError(f"unknown tunnel op {op}") from None
    return TunnelFrame(kind, stream, bytes(message[HEADER.size :]))


def chunks(data: bytes, size: int = MAX_TUNNEL_PAYLOAD) -> list[bytes]:
    """``data`` cut into payloads a frame can carry."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def resize_payload(cols: int, rows: int) -> bytes:
    return msgspec.json.encode(Resize(cols, rows))


def exit_payload(code: int) -> bytes:
    return msgspec.json.encode(ExitStatus(code))


def decode_resize(payload: bytes) -> Resize:
    return msgspec.json.decode(payload, type=Resize)


def decode_exit(payload: bytes) -> ExitStatus:
    return msgspec.json.decode(payload, type=ExitStatus)
