"""Real relays on 127.0.0.1 (port 0), a real test CA, real agent connections, and a Master stand-in."""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from access.config import AccessConfig
from access.daemon import AccessRelay
from common.errors import ProtocolError
from common.pki import (
    CertificateAuthority,
    CertRole,
    Identity,
    client_tls_context,
    identity_of,
    load_cert,
    server_tls_context,
    write_private_key,
)
from common.wire import (
    CLOSE_NOT_LEADER,
    HARD_FRAME_BYTES,
    AccessHello,
    AccessWelcome,
    EnrollRequest,
    EnrollResponse,
    LinkFrame,
    Relay,
    RelayEntry,
    decode_link_frame,
    decode_link_message,
    encode,
)

_names = itertools.count(1)


@dataclass
class Credentials:
    cert: Path
    key: Path
    identity: Identity


class TestPki:
    """A platform CA and the certificates a test needs, written to a temporary directory."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = CertificateAuthority.create("test platform CA")
        self.ca_file = root / "ca.crt"
        self.ca_file.write_bytes(self.ca.chain_pem())
        self.relay = self.issue(CertRole.ACCESS, "relay-test", server=True)
        self.master = self.issue(CertRole.MASTER, "master", server=True)

    def issue(
        self, role: CertRole, name: str, *, server: bool = False, ca: CertificateAuthority | None = None, valid_s: float = 3600
    ) -> Credentials:
        names = {"dns_names": ["localhost"], "ip_addresses": ["127.0.0.1"]} if server else {}
        key_pem, cert_pem = (ca or self.ca).issue_keypair(role, name, valid_s=valid_s, **names)
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        cert.write_bytes(cert_pem)
        write_private_key(key, key_pem)
        return Credentials(cert, key, identity_of(load_cert(cert_pem)))

    def agent(self, prefix: str = "agt") -> Credentials:
        return self.issue(CertRole.AGENT, f"{prefix}-{next(_names)}")

    def client_context(self, who: Credentials | None = None) -> ssl.SSLContext:
        if who is None:
            return client_tls_context(self.ca_file)
        return client_tls_context(self.ca_file, who.cert, who.key)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki(tmp_path_factory.mktemp("pki"))


class MasterStandIn:
    """A stand-in for the Master's relay-link endpoint: mutual TLS, ``access_hello`` -> ``access_welcome``, then it
    records every frame the relay sends and lets the test send frames back.

    It has none of the Master's logic; the real Master behind a real relay is covered by the end-to-end
    tests (tests/e2e).
    """

    def __init__(self, pki: TestPki) -> None:
        self._ssl = server_tls_context(pki.master.cert, pki.master.key, pki.ca_file, require_client_cert=True)
        self.frames: list[LinkFrame] = []
        self.revoked: list[str] = []  # sent in access_welcome
        self.links: list[ServerConnection] = []
        self.hellos: list[AccessHello] = []
        self.batches = True  # tells relays it takes several frames per message, as the Master does
        self.folds = False  # tells relays it takes report folds (the Master does; a test that wants them says so)
        self.messages: list[int] = []  # frames in each message received after the hello
        # Answer an enrollment request; None means "stay silent".
        self.answer_enroll: Callable[[EnrollRequest], EnrollResponse | None] = lambda req: EnrollResponse(
            req_id=req.req_id,
            ok=True,
            agent_id="agt-new",
            cert_pem="CERT",
            ca_pem="CA",
            command_keys={"k1": "pub"},
            key_endorsements={"k1": "sig"},
            relays=[RelayEntry(relay_id="relay-2", region="us-east", url="wss://relay-2.example:7200")],
        )
        self.port = 0
        self._server: Server | None = None
        # A standby (docs/ha.md): refuses every link with CLOSE_NOT_LEADER and this as the reason (the leader's URL).
        self.standby_naming: str | None = None
        self.refused = 0  # links refused as a standby

    @property
    def url(self) -> str:
        return f"wss://127.0.0.1:{self.port}/link"

    async def start(self) -> None:
        self._server = await serve(self._serve_link, "127.0.0.1", self.port, ssl=self._ssl, max_size=HARD_FRAME_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Go away like a crashed Master: close the listener and every link."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.links.clear()

    async def _serve_link(self, connection: ServerConnection) -> None:
        if self.standby_naming is not None:
            self.refused += 1
            await connection.close(CLOSE_NOT_LEADER, self.standby_naming)
            return
        hello = decode_link_frame(await connection.recv())
        assert isinstance(hello, AccessHello)
        self.hellos.append(hello)
        welcome = AccessWelcome(version=1, revoked_serials=self.revoked, batches=self.batches, folds=self.folds)
        await connection.send(encode(welcome), text=True)
        self.links.append(connection)
        try:
            async for message in connection:
                frames = decode_link_message(message)
                self.messages.append(len(frames))
                for frame in frames:
                    assert not isinstance(frame, ProtocolError), f"the relay sent a bad frame: {frame}"
                    self.frames.append(frame)
                    if isinstance(frame, EnrollRequest):
                        answer = self.answer_enroll(frame)
                        if answer is not None:
                            await connection.send(encode(answer), text=True)
        except ConnectionClosed:
            pass

    async def send(self, frame: Any) -> None:
        await self.links[-1].send(encode(frame), text=True)

    # --- what the tests read --------------------------------------------------------------------------

    def of_type(self, cls: type) -> list[Any]:
        return [f for f in self.frames if isinstance(f, cls)]

    def relayed(self, agent_id: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(agent id on the envelope, the agent frame as JSON) for every relayed frame, in arrival order."""
        return [
            (f.agent_id, json.loads(bytes(f.frame)))
            for f in self.frames
            if isinstance(f, Relay) and (agent_id is None or f.agent_id == agent_id)
        ]

    async def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 3.0) -> Any:
        return await eventually(predicate, what, timeout)


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = 3.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def master(pki: TestPki) -> AsyncIterator[MasterStandIn]:
    stand_in = MasterStandIn(pki)
    await stand_in.start()
    try:
        yield stand_in
    finally:
        await stand_in.stop()


RelayFactory = Callable[..., Awaitable[AccessRelay]]


@pytest.fixture
async def make_relay(pki: TestPki, master: MasterStandIn) -> AsyncIterator[RelayFactory]:
    """Start relays linked to the stand-in; every one is stopped at the end of the test."""
    relays: list[AccessRelay] = []

    async def start(*, wait_link: bool = True, **settings: Any) -> AccessRelay:
        values: dict[str, Any] = {
            "relay_id": pki.relay.identity.id,
            "region": "test",
            "master_url": master.url,
            "agent_port": 0,
            "http_port": 0,
            "cert_file": str(pki.relay.cert),
            "key_file": str(pki.relay.key),
            "ca_file": str(pki.ca_file),
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.2,
            "drain_timeout_s": 0.5,
            "enroll_timeout_s": 2.0,
        }
        values.update(settings)
        relay = AccessRelay(AccessConfig(**values))
        relays.append(relay)
        await relay.start()
        if wait_link:
            await relay.link.wait_up(5)
        return relay

    try:
        yield start
    finally:
        for relay in relays:
            await relay.stop()


@pytest.fixture
async def relay(make_relay: RelayFactory) -> AccessRelay:
    return await make_relay()


@pytest.fixture
def open_agent(pki: TestPki) -> Callable[..., Any]:
    """``async with open_agent(relay, creds) as ws``: a real agent-side TLS WebSocket."""

    def opener(relay: AccessRelay, who: Credentials | None, **kwargs: Any) -> Any:
        return connect(relay.agent_url, ssl=pki.client_context(who), open_timeout=5, max_size=HARD_FRAME_BYTES, **kwargs)

    return opener


def heartbeat(seq: int, **extra: Any) -> str:
    return json.dumps({"type": "heartbeat", "seq": seq, "ts": float(seq), **extra})


def result(command_id: str, **extra: Any) -> str:
    return json.dumps({"type": "command_result", "id": command_id, "ok": True, **extra})


async def next_json(ws: ClientConnection, timeout: float = 3.0) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))
