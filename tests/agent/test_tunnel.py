"""The agent's half of renter access (agent/tunnel.py): which tickets it serves, and what each kind of tunnel carries.

``RelayStandIn`` stands in for the Access relay's agent port while the relay's own ``/tunnel/<id>`` endpoint is
built: mutual TLS with certificates from a real test CA, it checks the path, the client certificate and the ticket
header as a relay does (``verify_at_relay``), and then hands the test the relay's side of the data WebSocket, so
the test plays the renter's end. For the daemon-level test it also serves the control link (hello, welcome,
heartbeats, ``tunnel_open``).

``LocalRuntime`` stands in for a container runtime (the real runtimes' logs/exec/connect are built on another
branch): ``exec`` runs a real subprocess, ``connect`` opens a real TCP connection to a real local server, ``logs``
replays what the test wrote to the container's log. It is used only through the ``ContainerRuntime`` Protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from access.config import AccessConfig
from access.daemon import AccessRelay
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.identity import CA_FILE, CERT_FILE, KEY_FILE, AgentIdentity
from agent.runtime.base import STDERR, STDOUT, ContainerRuntime, ExecSession
from agent.tunnel import PortStreams, RelayLink, TunnelLimits, TunnelRefusal, TunnelServer, renter_frame, tunnel_url
from common.containers import LABEL_COMMAND_ID, LABEL_PORTS, LABEL_WORKLOAD_ID, ContainerInfo, ContainerSpec
from common.errors import PKIError, ProtocolError, RuntimeFailure
from common.pki import (
    CertRole,
    CommandSigner,
    CommandVerifier,
    client_tls_context,
    load_cert,
    peer_identity,
    server_tls_context,
    write_private_key,
)
from common.tunnel import (
    AGENT_PATH_PREFIX,
    HEADER,
    MAX_TUNNEL_PAYLOAD,
    RENTER_PATH,
    TICKET_HEADER,
    Op,
    Ticket,
    TicketBody,
    TicketRefused,
    TunnelFrame,
    decode_exit,
    decode_frame,
    decode_ticket,
    encode_frame,
    encode_ticket,
    new_ticket_id,
    resize_payload,
    sign_ticket,
    verify_at_relay,
)
from common.wire import (
    CLOSE_TUNNEL_IDLE,
    CLOSE_TUNNEL_LIMIT,
    CLOSE_TUNNEL_PEER_GONE,
    Heartbeat,
    Hello,
    TunnelOpen,
    Welcome,
    decode_agent_frame,
    encode,
)
from management.client.tunnel import Tunnel
from management.services.tunnels import TunnelGrant
from tests.access.conftest import MasterStandIn, TestPki

RELAY_ID = "relay-test"  # the relay certificate tests/access makes
AGENT_ID = "agt-tunnel-1"
WORKLOAD = "wl-0a1b"
CONTAINER = "wl-0a1b-0"
DEADLINE_S = 5.0
DECLARED_PORTS = "8080,9,7000"  # what the test workload's spec declares: the only ports its tunnels may reach


# --- certificates, keys and tickets ------------------------------------------------------------------------------


@dataclass
class Pki:
    """The test CA of tests/access (its relay certificate names ``RELAY_ID``), an agent's certificate and the
    Master's command-signing key, endorsed by that CA."""

    base: TestPki
    signer: CommandSigner
    endorsement: str

    @property
    def root(self) -> Path:
        return self.base.root

    @property
    def ca_file(self) -> Path:
        return self.base.ca_file

    def agent_tls(self) -> ssl.SSLContext:
        return client_tls_context(self.ca_file, self.root / f"{AGENT_ID}.crt", self.root / f"{AGENT_ID}.key")

    def verifier(self) -> CommandVerifier:
        return CommandVerifier({self.signer.key_id: self.signer.public_key_b64()})

    def ticket(self, kind: str, *, signer: CommandSigner | None = None, **fields: Any) -> Ticket:
        now = time.time()
        signer = signer or self.signer
        values: dict[str, Any] = {
            "id": new_ticket_id(),
            "kind": kind,
            "account": "acct-renter",
            "workload": WORKLOAD,
            "agent_id": AGENT_ID,
            "container": CONTAINER,
            "relay_id": RELAY_ID,
            "issued_at": now,
            "expires_at": now + 60,
            "key_id": signer.key_id,
        }
        return sign_ticket(TicketBody(**{**values, **fields}), signer, self.endorsement)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = TestPki(tmp_path_factory.mktemp("tunnel-pki"))
    assert base.relay.identity.id == RELAY_ID
    base.issue(CertRole.AGENT, AGENT_ID)
    signer = CommandSigner.generate()
    return Pki(base, signer, base.ca.endorse_command_key(signer.public_key_b64()))


# --- the relay stand-in ------------------------------------------------------------------------------------------


class RelayStandIn:
    """Stands in for the Access relay's agent port (see the module's docstring): it admits a data WebSocket only on
    ``/tunnel/<id>`` with a client certificate of the ticket's agent and a ticket ``verify_at_relay`` accepts."""

    def __init__(self, pki: Pki) -> None:
        self._ssl = server_tls_context(pki.base.relay.cert, pki.base.relay.key, pki.ca_file, require_client_cert=True)
        self._ca = load_cert(pki.ca_file.read_bytes())
        self.dials: list[str] = []  # the path of every handshake, tunnel or control
        self.refused: list[str] = []
        self.tunnels: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self.control: Callable[[ServerConnection], Any] | None = None
        self._server: Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"wss://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RelayStandIn:
        self._server = await serve(
            self._serve, "127.0.0.1", 0, ssl=self._ssl, process_request=self._check, max_size=HEADER.size + MAX_TUNNEL_PAYLOAD
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        self.dials.append(request.path)
        if not request.path.startswith(AGENT_PATH_PREFIX):
            return None  # the control link
        try:
            ticket = decode_ticket(request.headers.get(TICKET_HEADER, ""))
            verify_at_relay(ticket, self._ca, RELAY_ID, time.time())
            if request.path != AGENT_PATH_PREFIX + ticket.body.id:
                raise TicketRefused(f"path {request.path} is not this ticket's")
            agent = peer_identity(connection.transport.get_extra_info("ssl_object"))
            if agent.role is not CertRole.AGENT or agent.id != ticket.body.agent_id:
                raise TicketRefused(f"certificate of {agent.id} does not serve this ticket")
        except (TicketRefused, PKIError) as exc:
            self.refused.append(str(exc))
            return connection.respond(403, f"{exc}\n")
        return None

    async def _serve(self, connection: ServerConnection) -> None:
        if connection.request is not None and connection.request.path.startswith(AGENT_PATH_PREFIX):
            await self.tunnels.put(connection)
            await connection.wait_closed()
        elif self.control is not None:
            await self.control(connection)

    async def renter_end(self) -> ServerConnection:
        """The relay's side of the next data WebSocket the agent dials: the test speaks for the renter on it."""
        return await asyncio.wait_for(self.tunnels.get(), DEADLINE_S)


async def next_frame(ws: ServerConnection) -> TunnelFrame:
    message = await asyncio.wait_for(ws.recv(), DEADLINE_S)
    assert isinstance(message, bytes)
    return decode_frame(message)


async def frames_until(ws: ServerConnection, last: Op, stream: int = 0) -> list[TunnelFrame]:
    """Frames the agent sends, up to and including ``last`` on ``stream``."""
    got = []
    while True:
        frame = await next_frame(ws)
        got.append(frame)
        if frame.op is last and frame.stream == stream:
            return got


async def closed_with(ws: ServerConnection) -> int | None:
    await asyncio.wait_for(ws.wait_closed(), DEADLINE_S)
    return ws.close_code


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# --- the runtime stand-in ------------------------------------------------------------------------------------------


class LocalExec:
    """A real subprocess as an ``ExecSession`` (no terminal: RESIZE is recorded, as a runtime's no-op would be)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.resizes: list[tuple[int, int]] = []
        self.closed = asyncio.Event()
        self._output: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue(4)
        self._open = 2
        assert process.stdout is not None and process.stderr is not None
        self._readers = [
            asyncio.create_task(self._pump(STDOUT, process.stdout)),
            asyncio.create_task(self._pump(STDERR, process.stderr)),
        ]

    async def _pump(self, channel: int, stream: asyncio.StreamReader) -> None:
        while data := await stream.read(4096):
            await self._output.put((channel, data))
        await self._output.put(None)

    async def read(self) -> tuple[int, bytes] | None:
        while self._open:
            item = await self._output.get()
            if item is not None:
                return item
            self._open -= 1
        return None

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    async def resize(self, cols: int, rows: int) -> None:
        self.resizes.append((cols, rows))

    async def wait(self) -> int:
        return await self.process.wait()

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        for reader in self._readers:
            reader.cancel()
        self.closed.set()


@dataclass
class LocalRuntime:
    """Stands in for a container runtime (see the module's docstring)."""

    name: str = "process"
    isolation: str = "none"
    containers: dict[str, ContainerInfo] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> a real local port
    log: list[tuple[int, bytes]] = field(default_factory=list)
    log_changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    sessions: list[LocalExec] = field(default_factory=list)

    def run(
        self, name: str = CONTAINER, *, workload: str = WORKLOAD, state: str = "running", ports: str = DECLARED_PORTS
    ) -> None:
        """A container as the agent's executor labels it: the create command, the workload, its declared ports."""
        labels = {LABEL_COMMAND_ID: "cmd-1", LABEL_WORKLOAD_ID: workload, LABEL_PORTS: ports}
        self.containers[name] = ContainerInfo(id=f"id-{name}", name=name, runtime=self.name, state=state, labels=labels)

    async def write_log(self, channel: int, data: bytes) -> None:
        async with self.log_changed:
            self.log.append((channel, data))
            self.log_changed.notify_all()

    async def end(self, name: str = CONTAINER) -> None:
        async with self.log_changed:
            self.containers[name] = msgspec.structs.replace(self.containers[name], state="exited", exit_code=0)
            self.log_changed.notify_all()

    async def probe(self) -> None:
        return None

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        raise RuntimeFailure("this test runtime creates nothing")

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        return self.containers.pop(name, None)

    async def inspect(self, name: str) -> ContainerInfo | None:
        return self.containers.get(name)

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return [c for c in self.containers.values() if c.labels.get(label_key) == label_value]

    async def list(self) -> list[ContainerInfo]:
        return list(self.containers.values())

    async def close(self) -> None:
        return None

    def _running(self, name: str) -> None:
        if name not in self.containers or self.containers[name].state != "running":
            raise RuntimeFailure(f"container {name} does not run here")

    async def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        if name not in self.containers:
            raise RuntimeFailure(f"container {name} does not run here")
        sent = max(0, len(self.log) - tail) if tail >= 0 else 0
        while True:
            async with self.log_changed:
                if sent == len(self.log) and follow and self.containers[name].state == "running":
                    await self.log_changed.wait()
                fresh, sent = self.log[sent:], len(self.log)
                ended = not follow or self.containers[name].state != "running"
            for entry in fresh:
                yield entry
            if ended and sent == len(self.log):
                return

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        self._running(name)
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except FileNotFoundError:
            raise RuntimeFailure(f"{command[0]}: no such command in container {name}") from None
        session = LocalExec(process)
        self.sessions.append(session)
        return session

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._running(name)
        return await asyncio.open_connection("127.0.0.1", self.ports.get(port, 1))


def typed(runtime: LocalRuntime) -> ContainerRuntime:
    return runtime  # checked by mypy against the Protocol


# --- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture
async def relay(pki: Pki) -> AsyncIterator[RelayStandIn]:
    async with RelayStandIn(pki) as stand_in:
        yield stand_in


@pytest.fixture
def runtime() -> LocalRuntime:
    made = LocalRuntime()
    made.run()
    return made


@pytest.fixture
async def server(pki: Pki, runtime: LocalRuntime) -> AsyncIterator[TunnelServer]:
    made = TunnelServer(AGENT_ID, pki.verifier(), typed(runtime), TunnelLimits(max_tunnels=2, max_streams=2))
    yield made
    await made.close()


def link_to(relay: RelayStandIn, pki: Pki) -> RelayLink:
    return RelayLink(relay_id=RELAY_ID, url=relay.url, ssl=pki.agent_tls())


# --- the decisions, without I/O --------------------------------------------------------------------------------


def test_the_tunnel_url_is_the_relays_agent_port_with_the_ticket_id():
    assert tunnel_url("wss://relay.example:7200", "tun-00ff") == "wss://relay.example:7200/tunnel/tun-00ff"
    assert tunnel_url("wss://relay.example:7200/agent?x=1", "tun-00ff") == "wss://relay.example:7200/tunnel/tun-00ff"
    with pytest.raises(TunnelRefusal, match="not of the form"):
        tunnel_url("wss://relay.example:7200", "tun-../../admin")


@pytest.mark.parametrize(
    ("kind", "op", "stream"),
    [("logs", Op.DATA, 0), ("exec", Op.OPEN, 0), ("exec", Op.DATA, 3), ("port", Op.RESIZE, 1), ("port", Op.EXIT, 1)],
)
def test_a_renter_frame_the_kind_does_not_take_is_a_protocol_error(kind, op, stream):
    from common.tunnel import TunnelKind

    with pytest.raises(ProtocolError):
        renter_frame(TunnelKind(kind), encode_frame(op, stream, b"x"))


def test_port_streams_are_capped_and_end_when_both_sides_sent_eof():
    streams = PortStreams(max_streams=2)
    streams.open(1)
    streams.open(2)
    with pytest.raises(TunnelRefusal, match="2 connections open"):
        streams.open(3)
    with pytest.raises(ProtocolError, match="open already"):
        streams.open(1)
    assert streams.eof(1, from_renter=True) is False
    with pytest.raises(ProtocolError, match="after its EOF"):
        streams.renter_data(1)
    assert streams.eof(1, from_renter=False) is True
    assert streams.close(1) and not streams.is_open(1)
    streams.open(3)  # a place freed
    with pytest.raises(ProtocolError, match="not open"):
        streams.renter_data(9)


# --- which tickets are served ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flaw", ["forged", "tampered", "expired", "other agent", "other relay"])
async def test_a_ticket_that_does_not_check_out_is_dropped_without_dialling(pki, relay, server, flaw, caplog):
    if flaw == "forged":
        ticket = pki.ticket("logs", signer=CommandSigner.generate())
    elif flaw == "tampered":
        good = pki.ticket("logs")
        ticket = msgspec.structs.replace(good, body=msgspec.structs.replace(good.body, container="someone-elses"))
    elif flaw == "expired":
        ticket = pki.ticket("logs", issued_at=time.time() - 120, expires_at=time.time() - 60)
    elif flaw == "other agent":
        ticket = pki.ticket("logs", agent_id="agt-other")
    else:
        ticket = pki.ticket("logs", relay_id="relay-elsewhere")
    caplog.set_level("WARNING", logger="agent.tunnel")
    assert server.open(ticket, link_to(relay, pki)) is False
    assert server.active == 0 and relay.dials == []  # nothing runs that could dial later
    refusal = next(r for r in caplog.records if r.getMessage() == "tunnel refused")
    assert refusal.ticket == ticket.body.id


async def test_with_no_relay_link_up_a_ticket_is_dropped(pki, server):
    assert server.open(pki.ticket("logs"), None) is False


@pytest.mark.parametrize("container", ["not-here", "of-another-workload", "exited"])
async def test_a_good_ticket_for_a_container_not_running_here_tells_the_renter_why(pki, relay, server, runtime, container):
    runtime.run("of-another-workload", workload="wl-ffff")
    runtime.run("exited", state="exited")
    assert server.open(pki.ticket("exec", container=container, command=["true"]), link_to(relay, pki))
    renter = await relay.renter_end()
    frame = await next_frame(renter)
    assert frame.op is Op.ERROR and container.encode() in frame.payload
    assert await closed_with(renter) == 1000
    assert container in (renter.close_reason or "")  # also for a renter that arrives after the agent left
    assert runtime.sessions == []  # nothing was started


async def test_tunnels_over_the_agents_cap_are_refused_and_the_renter_told(pki, relay, server, runtime):
    link = link_to(relay, pki)
    held = [pki.ticket("logs", follow=True), pki.ticket("logs", follow=True)]
    for ticket in held:
        assert server.open(ticket, link)
        await relay.renter_end()
    assert server.active == 2

    assert server.open(pki.ticket("logs", follow=True), link) is False
    refused = await relay.renter_end()
    frame = await next_frame(refused)
    assert frame.op is Op.ERROR and b"the most it allows" in frame.payload
    assert await closed_with(refused) == CLOSE_TUNNEL_LIMIT
    assert server.active == 2  # the two held ones go on


async def test_one_account_and_one_workload_cannot_take_every_slot_of_a_shared_host(pki, relay, runtime):
    """Issue 22 D10: 16 idle follow-logs tunnels of one renter locked its co-tenants out. Now a workload and an account
    each hold at most their share of the host's slots; the one refused is told which limit, and others still get in."""
    runtime.run("wl-0a1c-0", workload="wl-0a1c")  # alice's second workload
    runtime.run("wl-0b0b-0", workload="wl-0b0b")  # bob's
    limits = TunnelLimits(max_tunnels=6, max_per_account=3, max_per_workload=2)
    server = TunnelServer(AGENT_ID, pki.verifier(), typed(runtime), limits)
    link = link_to(relay, pki)

    def logs(workload: str, container: str, account: str = "acct-alice") -> Ticket:
        return pki.ticket("logs", follow=True, account=account, workload=workload, container=container)

    async def refused_with(ticket: Ticket) -> bytes:
        assert server.open(ticket, link) is False
        renter = await relay.renter_end()
        frame = await next_frame(renter)
        assert frame.op is Op.ERROR
        assert await closed_with(renter) == CLOSE_TUNNEL_LIMIT
        return frame.payload

    try:
        for _ in range(2):
            assert server.open(logs(WORKLOAD, CONTAINER), link)
            await relay.renter_end()
        assert b"workload wl-0a1b has 2 tunnels open on this host, the most one workload may" in await refused_with(
            logs(WORKLOAD, CONTAINER)
        )
        assert server.open(logs("wl-0a1c", "wl-0a1c-0"), link)
        await relay.renter_end()
        assert b"account acct-alice has 3 tunnels open on this host, the most one account may" in await refused_with(
            logs("wl-0a1c", "wl-0a1c-0")
        )
        # The co-tenant still reaches its container: a shell, as the console's terminal opens one.
        shell = pki.ticket("exec", account="acct-bob", workload="wl-0b0b", container="wl-0b0b-0", command=["cat"])
        assert server.open(shell, link)
        renter = await relay.renter_end()
        await renter.send(encode_frame(Op.DATA, 0, b"bob is in\n"))
        assert (await next_frame(renter)).payload == b"bob is in\n"
        assert server.active == 4
    finally:
        await server.close()


async def test_an_idle_tunnel_is_closed_and_gives_its_slot_back(pki, relay, runtime):
    """Issue 22 D10: a follow-logs tunnel on a quiet container held a host slot for ever. Nothing either way for
    ``idle_timeout_s`` closes it (a code of its own, the reason saying so); the slot is free again."""
    server = TunnelServer(AGENT_ID, pki.verifier(), typed(runtime), TunnelLimits(max_tunnels=1, idle_timeout_s=0.3))
    try:
        assert server.open(pki.ticket("logs", follow=True), link_to(relay, pki))
        renter = await relay.renter_end()
        assert await closed_with(renter) == CLOSE_TUNNEL_IDLE
        assert "idle for 0.3 s" in (renter.close_reason or "")
        await eventually(lambda: server.active == 0, "the idle tunnel to let go of its slot")
        assert server.open(pki.ticket("logs", follow=True), link_to(relay, pki))  # the one slot is free again
    finally:
        await server.close()


async def test_a_tunnel_in_use_is_not_idle(pki, relay, runtime):
    """Bytes either way keep a tunnel open past the idle timeout: only a silent one is closed."""
    server = TunnelServer(AGENT_ID, pki.verifier(), typed(runtime), TunnelLimits(idle_timeout_s=1.5))
    try:
        assert server.open(pki.ticket("exec", command=["cat"]), link_to(relay, pki))
        renter = await relay.renter_end()
        for n in range(30):  # 3 s of typing, a line every 0.1 s: twice the idle timeout
            await renter.send(encode_frame(Op.DATA, 0, b"%d\n" % n))
            assert (await next_frame(renter)).payload == b"%d\n" % n
            await asyncio.sleep(0.1)
        await renter.send(encode_frame(Op.EOF))
        assert [f.op for f in await frames_until(renter, Op.EXIT)] == [Op.EXIT]
        assert await closed_with(renter) == 1000
    finally:
        await server.close()


@pytest.fixture
async def host_loopback_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A real server on the host's loopback that no workload declared (another renter's, the Master's /metrics):
    its port and what reached it."""
    reached: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append(await reader.read(100))
        writer.write(b"the host's secret\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield listener.sockets[0].getsockname()[1], reached
    listener.close()
    await listener.wait_closed()


@pytest.mark.parametrize("declared", [DECLARED_PORTS, ""])
async def test_a_port_the_workload_did_not_declare_is_refused_even_with_a_signed_ticket(
    pki, relay, server, runtime, host_loopback_server, declared
):
    """Issue 22 D9: a port tunnel reached any port. The agent checks the ticket's port against the ports the create
    command declared (the container's label), whatever signed the ticket, and connects to nothing else."""
    port, reached = host_loopback_server
    runtime.run(ports=declared)
    runtime.ports[port] = port  # the runtime would connect there, were it asked
    assert server.open(pki.ticket("port", port=port), link_to(relay, pki))
    renter = await relay.renter_end()
    with contextlib.suppress(ConnectionClosed):  # the agent may have closed already
        await renter.send(encode_frame(Op.OPEN, 1))
        await renter.send(encode_frame(Op.DATA, 1, b"GET /metrics\r\n"))
    frame = await next_frame(renter)
    assert (frame.op, frame.stream) == (Op.ERROR, 0), frame
    named = ", ".join(declared.split(",")) if declared else "none"
    assert f"port {port} is not a port workload {WORKLOAD} declared (declared: {named})".encode() in frame.payload
    assert await closed_with(renter) == 1000
    assert reached == []  # nothing was connected to


async def test_an_exec_argument_with_a_nul_is_refused_not_cut_short(pki, relay, server, runtime):
    """Issue 22: a NUL in an exec argument silently truncated it. The agent refuses the command and runs nothing."""
    assert server.open(pki.ticket("exec", command=["echo", "safe\0; rm -rf /"]), link_to(relay, pki))
    renter = await relay.renter_end()
    frame = await next_frame(renter)
    assert frame.op is Op.ERROR and b"command[1] holds a NUL byte" in frame.payload
    assert await closed_with(renter) == 1000
    assert runtime.sessions == []  # nothing was started


# --- logs ----------------------------------------------------------------------------------------------------


async def test_logs_tail_then_follow_arrive_in_order_and_end_with_exit(pki, relay, server, runtime):
    for n in range(1, 6):
        await runtime.write_log(STDOUT, f"line {n}\n".encode())
    assert server.open(pki.ticket("logs", tail=2, follow=True), link_to(relay, pki))
    renter = await relay.renter_end()
    assert [(f.op, f.payload) for f in [await next_frame(renter), await next_frame(renter)]] == [
        (Op.DATA, b"line 4\n"),
        (Op.DATA, b"line 5\n"),
    ]
    await runtime.write_log(STDERR, b"warning 6\n")
    big = b"x" * (MAX_TUNNEL_PAYLOAD + 10)
    await runtime.write_log(STDOUT, big)
    await runtime.end()
    rest = await frames_until(renter, Op.EXIT)
    assert [(f.op, len(f.payload)) for f in rest[:-1]] == [(Op.STDERR, 10), (Op.DATA, MAX_TUNNEL_PAYLOAD), (Op.DATA, 10)]
    assert decode_exit(rest[-1].payload).code == 0
    assert await closed_with(renter) == 1000
    await eventually(lambda: server.active == 0, "the tunnel to end")


async def test_logs_without_follow_end_at_once_with_what_there_is(pki, relay, server, runtime):
    await runtime.write_log(STDOUT, b"only line\n")
    assert server.open(pki.ticket("logs", tail=-1), link_to(relay, pki))
    renter = await relay.renter_end()
    frames = await frames_until(renter, Op.EXIT)
    assert [(f.op, f.payload) for f in frames[:-1]] == [(Op.DATA, b"only line\n")]
    assert await closed_with(renter) == 1000


async def test_a_frame_the_renter_may_not_send_closes_the_tunnel_as_bad_frame(pki, relay, server):
    assert server.open(pki.ticket("logs", follow=True), link_to(relay, pki))
    renter = await relay.renter_end()
    await renter.send(encode_frame(Op.DATA, 0, b"into the logs?"))
    assert await closed_with(renter) == 4024
    assert "DATA" in (renter.close_reason or "")


# --- exec -----------------------------------------------------------------------------------------------------


async def test_exec_echoes_input_takes_a_resize_and_ends_with_the_exit_status(pki, relay, server, runtime, caplog):
    caplog.set_level("INFO", logger="agent.tunnel")
    assert server.open(pki.ticket("exec", command=["cat"]), link_to(relay, pki))
    renter = await relay.renter_end()
    await renter.send(encode_frame(Op.DATA, 0, b"hello through the grid\n"))
    echoed = await next_frame(renter)
    assert (echoed.op, echoed.payload) == (Op.DATA, b"hello through the grid\n")

    await renter.send(encode_frame(Op.RESIZE, 0, resize_payload(132, 43)))
    await eventually(lambda: runtime.sessions[0].resizes == [(132, 43)], "the resize to reach the session")

    await renter.send(encode_frame(Op.EOF))
    (ended,) = await frames_until(renter, Op.EXIT)
    assert decode_exit(ended.payload).code == 0
    assert await closed_with(renter) == 1000
    await eventually(lambda: server.active == 0, "the tunnel to end")
    opened, closed = [r for r in caplog.records if r.getMessage() in ("tunnel opened", "tunnel closed")]
    assert (opened.getMessage(), opened.kind, opened.workload) == ("tunnel opened", "exec", WORKLOAD)
    line = closed.__dict__
    assert (line["why"], line["bytes_in"], line["bytes_out"]) == ("completed", 23 + len(resize_payload(132, 43)), 23 + 10)
    assert line["duration_s"] >= 0


async def test_exec_reports_standard_error_and_a_failing_status(pki, relay, server):
    command = ["sh", "-c", "echo broken >&2; exit 3"]
    assert server.open(pki.ticket("exec", command=command), link_to(relay, pki))
    renter = await relay.renter_end()
    frames = await frames_until(renter, Op.EXIT)
    assert (frames[0].op, frames[0].payload) == (Op.STDERR, b"broken\n")
    assert decode_exit(frames[-1].payload).code == 3


async def test_a_command_the_runtime_cannot_start_gives_error_saying_why(pki, relay, server):
    assert server.open(pki.ticket("exec", command=["no-such-command-here"]), link_to(relay, pki))
    renter = await relay.renter_end()
    frame = await next_frame(renter)
    assert frame.op is Op.ERROR and b"no-such-command-here: no such command" in frame.payload
    assert await closed_with(renter) == 1000


async def test_input_after_the_command_ended_is_dropped_and_its_exit_still_arrives(pki, relay, server):
    assert server.open(pki.ticket("exec", command=["sh", "-c", "exit 7"]), link_to(relay, pki))
    renter = await relay.renter_end()
    with contextlib.suppress(ConnectionClosed):  # the tunnel may be over before all of it went
        for _ in range(20):  # typed while it was ending: nothing to feed it to
            await renter.send(encode_frame(Op.DATA, 0, b"late input\n"))
    (ended,) = await frames_until(renter, Op.EXIT)
    assert decode_exit(ended.payload).code == 7
    assert await closed_with(renter) == 1000


async def test_when_the_renter_leaves_the_command_is_stopped(pki, relay, server, runtime):
    assert server.open(pki.ticket("exec", command=["sleep", "60"]), link_to(relay, pki))
    renter = await relay.renter_end()
    await eventually(lambda: bool(runtime.sessions), "the command to start")
    await renter.close(CLOSE_TUNNEL_PEER_GONE, "the renter went away")  # what the relay does when its end goes
    session = runtime.sessions[0]
    await asyncio.wait_for(session.closed.wait(), DEADLINE_S)
    assert session.process.returncode is not None  # killed, not left running
    await eventually(lambda: server.active == 0, "the tunnel to end")


# --- port ------------------------------------------------------------------------------------------------------


@pytest.fixture
async def http_port(runtime: LocalRuntime) -> AsyncIterator[asyncio.Event]:
    """A real HTTP server as the container's port 8080: ``/first`` answers only once ``/second`` was asked, so both
    connections must be open at once for either to finish."""
    second_asked = asyncio.Event()

    async def first(request: web.Request) -> web.Response:
        await asyncio.wait_for(second_asked.wait(), DEADLINE_S)
        return web.Response(text="first answered")

    async def second(request: web.Request) -> web.Response:
        second_asked.set()
        return web.Response(text="second answered")

    app = web.Application()
    app.add_routes([web.get("/first", first), web.get("/second", second)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runtime.ports[8080] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield second_asked
    await runner.cleanup()


def http_get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: container\r\nConnection: close\r\n\r\n".encode()


async def collect_streams(renter: ServerConnection, streams: set[int]) -> dict[int, list[TunnelFrame]]:
    """What the agent sends on ``streams`` until each is closed; the renter answers the server's EOF with its own."""
    got: dict[int, list[TunnelFrame]] = {s: [] for s in streams}
    open_streams = set(streams)
    while open_streams:
        frame = await next_frame(renter)
        got[frame.stream].append(frame)
        if frame.op is Op.EOF:
            await renter.send(encode_frame(Op.EOF, frame.stream))
        if frame.op is Op.CLOSE:
            open_streams.discard(frame.stream)
    return got


async def test_port_carries_two_concurrent_connections_to_a_real_http_server(pki, relay, server, http_port):
    assert server.open(pki.ticket("port", port=8080), link_to(relay, pki))
    renter = await relay.renter_end()
    await renter.send(encode_frame(Op.OPEN, 1))
    await renter.send(encode_frame(Op.OPEN, 2))
    await renter.send(encode_frame(Op.DATA, 1, http_get("/first")))
    await renter.send(encode_frame(Op.DATA, 2, http_get("/second")))
    got = await collect_streams(renter, {1, 2})
    for stream, text in [(1, b"first answered"), (2, b"second answered")]:
        frames = got[stream]
        body = b"".join(f.payload for f in frames if f.op is Op.DATA)
        assert body.startswith(b"HTTP/1.1 200") and body.endswith(text)
        assert [f.op for f in frames[-2:]] == [Op.EOF, Op.CLOSE]  # the server's half-close, then the stream's end

    # The tunnel outlives its streams: a third connection on a reused id works too.
    await renter.send(encode_frame(Op.OPEN, 1))
    await renter.send(encode_frame(Op.DATA, 1, http_get("/second")))
    again = await collect_streams(renter, {1})
    assert b"second answered" in b"".join(f.payload for f in again[1])


async def test_a_refused_port_gives_error_on_its_stream_and_the_tunnel_goes_on(pki, relay, server, runtime, http_port):
    assert server.open(pki.ticket("port", port=9), link_to(relay, pki))  # nothing listens on the container's port 9
    renter = await relay.renter_end()
    await renter.send(encode_frame(Op.OPEN, 5))
    error, close = await next_frame(renter), await next_frame(renter)
    assert (error.op, error.stream, close.op, close.stream) == (Op.ERROR, 5, Op.CLOSE, 5)
    assert b"cannot connect to port 9 of container" in error.payload
    assert server.active == 1


async def test_streams_over_the_tunnels_cap_are_refused_one_by_one(pki, relay, server, runtime, http_port):
    assert server.open(pki.ticket("port", port=8080), link_to(relay, pki))
    renter = await relay.renter_end()
    for stream in (1, 2, 3):  # the server fixture allows 2
        await renter.send(encode_frame(Op.OPEN, stream))
    error = await next_frame(renter)
    assert (error.op, error.stream) == (Op.ERROR, 3) and b"the most it allows" in error.payload
    assert (await next_frame(renter)).op is Op.CLOSE


async def test_a_close_from_the_renter_ends_that_connection_to_the_container(pki, relay, server, runtime):
    arrived, ended = asyncio.Event(), asyncio.Event()

    async def container_port(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.read(1) == b"x"
        arrived.set()
        if await reader.read() == b"":  # the agent dropped the connection
            ended.set()
        writer.close()

    listener = await asyncio.start_server(container_port, "127.0.0.1", 0)
    runtime.ports[7000] = listener.sockets[0].getsockname()[1]
    try:
        assert server.open(pki.ticket("port", port=7000), link_to(relay, pki))
        renter = await relay.renter_end()
        await renter.send(encode_frame(Op.OPEN, 1))
        await renter.send(encode_frame(Op.DATA, 1, b"x"))
        await asyncio.wait_for(arrived.wait(), DEADLINE_S)
        await renter.send(encode_frame(Op.CLOSE, 1))
        await asyncio.wait_for(ended.wait(), DEADLINE_S)
        await renter.send(encode_frame(Op.OPEN, 1))  # the id is free again, the tunnel goes on
        await renter.send(encode_frame(Op.DATA, 1, b"x"))
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), DEADLINE_S)
    finally:
        listener.close()


async def test_closing_the_server_closes_its_tunnels_going_away(pki, relay, server, runtime):
    await runtime.write_log(STDOUT, b"serving\n")
    assert server.open(pki.ticket("logs", follow=True), link_to(relay, pki))
    renter = await relay.renter_end()
    assert (await next_frame(renter)).payload == b"serving\n"
    await server.close()
    assert await closed_with(renter) == 1001
    assert server.open(pki.ticket("logs"), link_to(relay, pki)) is False  # a stopping agent takes no new tunnel


# --- in the daemon: the control link goes on while a tunnel pumps -------------------------------------------------


def enrolled_agent(pki: Pki, root: Path) -> Path:
    """An agent's state directory as enrollment leaves it, with this test CA and signing key."""
    state = root / "agent"
    state.mkdir(mode=0o700)
    cert, key = pki.root / f"{AGENT_ID}.crt", pki.root / f"{AGENT_ID}.key"
    (state / CERT_FILE).write_bytes(cert.read_bytes())
    write_private_key(state / KEY_FILE, key.read_bytes())
    (state / CA_FILE).write_bytes(pki.ca_file.read_bytes())
    AgentIdentity(state, AGENT_ID, command_keys={pki.signer.key_id: pki.signer.public_key_b64()}).save()
    return state


async def test_the_daemon_keeps_heartbeating_while_a_tunnel_pumps_and_closes_it_on_stop(pki, relay, runtime, tmp_path):
    heartbeats: list[Heartbeat] = []
    ticket = pki.ticket("exec", command=["cat"])

    async def control(link: ServerConnection) -> None:  # the relay's control side, speaking for the Master
        hello = decode_agent_frame(await link.recv())
        assert isinstance(hello, Hello)
        keys = {pki.signer.key_id: pki.signer.public_key_b64()}
        await link.send(
            encode(Welcome(version=1, agent_id=AGENT_ID, heartbeat_s=0.05, telemetry_s=60, command_keys=keys)), text=True
        )
        await link.send(encode(TunnelOpen(ticket=ticket)), text=True)
        async for message in link:
            frame = decode_agent_frame(message)
            if isinstance(frame, Heartbeat):
                heartbeats.append(frame)

    relay.control = control
    config = AgentConfig(
        state_dir=str(enrolled_agent(pki, tmp_path)), access_urls=[relay.url], simulate="a10:1", measure_bandwidth=False
    )
    agent = Agent(config, runtime=typed(runtime))
    running = asyncio.create_task(agent.run())
    try:
        renter = await relay.renter_end()
        # Pump through the command until the control link has carried five more heartbeats meanwhile.
        before, rounds = len(heartbeats), 0
        chunk = bytes(range(256)) * 64
        while len(heartbeats) < before + 5:
            await renter.send(encode_frame(Op.DATA, 0, chunk))
            echoed = b""
            while len(echoed) < len(chunk):
                echoed += (await next_frame(renter)).payload
            assert echoed == chunk
            rounds += 1
            assert rounds < 10_000, "no heartbeats while the tunnel pumped"
        assert [h.running for h in heartbeats[-1:]] == [[CONTAINER]]

        agent.stop()
        assert await closed_with(renter) == 1001
        await asyncio.wait_for(running, DEADLINE_S)
        assert runtime.sessions[0].closed.is_set()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def test_the_tunnel_limits_are_settings_with_defaults():
    config = AgentConfig()
    assert (config.max_tunnels, config.max_tunnel_streams, config.tunnel_dial_timeout_s) == (16, 32, 10.0)
    assert (config.max_tunnels_per_account, config.max_tunnels_per_workload, config.tunnel_idle_timeout_s) == (8, 6, 900.0)
    assert json.loads(msgspec.json.encode(config))["max_tunnels"] == 16


# --- through the real relay --------------------------------------------------------------------------------------


async def test_through_the_real_relay_a_renter_runs_a_command_and_reaches_a_port(pki, runtime, server, http_port):
    """The relay of access/ (its tunnel exchange) between this agent's end and the renter's client of management/;
    only the Master is a stand-in (tests/access/conftest.py)."""
    master = MasterStandIn(pki.base)
    await master.start()
    relay = AccessRelay(
        AccessConfig(
            relay_id=RELAY_ID,
            region="test",
            master_url=master.url,
            agent_port=0,
            http_port=0,
            cert_file=str(pki.base.relay.cert),
            key_file=str(pki.base.relay.key),
            ca_file=str(pki.ca_file),
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            drain_timeout_s=0.5,
        )
    )
    await relay.start()
    try:
        link = RelayLink(relay_id=RELAY_ID, url=relay.agent_url, ssl=pki.agent_tls())
        shell = pki.ticket("exec", command=["sh", "-c", "cat; echo done >&2; exit 4"])
        assert server.open(shell, link)
        async with await Tunnel.open(grant_for(shell, relay.http_url, pki)) as tunnel:
            await tunnel.send(Op.DATA, 0, b"over the relay\n")
            echoed = await tunnel.receive()
            assert echoed is not None and (echoed.op, echoed.payload) == (Op.DATA, b"over the relay\n")
            await tunnel.send(Op.EOF)
            frames = [await tunnel.receive(), await tunnel.receive()]
            assert [(f.op, f.payload) for f in frames if f is not None] == [(Op.STDERR, b"done\n"), (Op.EXIT, b'{"code":4}')]
            assert await tunnel.receive() is None and tunnel.close_code == 1000

        web_port = pki.ticket("port", port=8080)
        assert server.open(web_port, link)
        async with await Tunnel.open(grant_for(web_port, relay.http_url, pki)) as tunnel:
            for stream, path in [(1, "/first"), (2, "/second")]:
                await tunnel.send(Op.OPEN, stream)
                await tunnel.send(Op.DATA, stream, http_get(path))
            bodies: dict[int, bytes] = {1: b"", 2: b""}
            while not all(b.endswith(b"answered") for b in bodies.values()):
                frame = await asyncio.wait_for(tunnel.receive(), DEADLINE_S)
                assert frame is not None and frame.op is not Op.ERROR
                if frame.op is Op.DATA:
                    bodies[frame.stream] += frame.payload
            assert bodies[1].endswith(b"first answered") and bodies[2].endswith(b"second answered")
    finally:
        await server.close()
        await relay.stop()
        await master.stop()


def grant_for(ticket: Ticket, http_url: str, pki: Pki) -> TunnelGrant:
    """What the API answers a renter: the relay's renter URL, the ticket, the CA to trust."""
    return TunnelGrant(
        id=ticket.body.id,
        kind=ticket.body.kind,
        workload=ticket.body.workload,
        agent_id=ticket.body.agent_id,
        relay_id=ticket.body.relay_id,
        url=http_url.replace("https://", "wss://", 1) + RENTER_PATH,
        ticket=encode_ticket(ticket),
        ca_pem=pki.ca_file.read_text(),
        expires_at=ticket.body.expires_at,
    )
