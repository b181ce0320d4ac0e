"""Issue 3, identity lifecycle, end to end on real processes: certificates renewed over the link without
reconnecting, expired ones refused, revocation on every relay across restarts, command-signing keys
rotated and retired, and no agent speaking for another."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import ssl
import time
import urllib.request
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.serialization import Encoding
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect

from agent.simulate import SimulatedCollector
from common.inventory import GpuSample, HostInfo, Inventory
from common.pki import (
    CertRole,
    CommandSigner,
    client_tls_context,
    generate_key,
    identity_of,
    key_to_pem,
    load_cert,
    make_csr,
    write_private_key,
)
from common.wire import (
    AgentEvent,
    AgentEventKind,
    CommandAck,
    CommandBody,
    CommandResult,
    Heartbeat,
    Hello,
    RenewRequest,
    Telemetry,
    encode,
    signing_bytes,
)
from management.client.api import instant
from master.keys import SigningKeyRing
from tests.support.grid import (
    Daemon,
    Grid,
    RelayInfo,
    refused,
    wait_for,
)
from tests.support.tamper import TamperingRelay

EXPIRY_SWEEP_S = 5.0  # access.relay.SWEEP_INTERVAL_S: how often a relay looks for expired sessions
REVOCATION_DEADLINE_S = 5.0


# --- helpers ---------------------------------------------------------------------------------


def short_lived_grid(root: Path, agent_cert_s: float, *relays: tuple[str, str]) -> tuple[Grid, Path]:
    """A Master issuing ``agent_cert_s``-second agent certificates, and its relays; returns the grid and its config."""
    config = root / "master.toml"
    config.write_text(f"agent_cert_s = {agent_cert_s}\n")
    grid = Grid(root)
    grid.start_master("--config", str(config))
    for relay_id, region in relays or (("relay-1", "eu-west"),):
        grid.start_relay(relay_id, region)
    return grid, config


def enroll(grid: Grid, name: str, relay: str = "relay-1") -> str:
    done = grid.enroll(name, grid.relays[relay])
    assert done.returncode == 0, done.stderr
    return grid.agent_id(name)


def keep_pair(grid: Grid, name: str, into: Path) -> Path:
    """A copy of an agent's current key and certificate, as a thief or a stale backup would hold them."""
    into.mkdir(parents=True, exist_ok=True)
    for file in ("agent.key", "agent.crt", "ca.crt"):
        shutil.copy2(grid.agent_dir(name) / file, into / file)
    return into


def context_for(pair: Path) -> ssl.SSLContext:
    return client_tls_context(pair / "ca.crt", pair / "agent.crt", pair / "agent.key")


def serial_of(pair: Path) -> str:
    return identity_of(load_cert((pair / "agent.crt").read_bytes())).serial


def relay_counter(grid: Grid, relay: RelayInfo, name: str, **labels: str) -> float:
    context = ssl.create_default_context(cafile=str(grid.authority.ca_file))
    with urllib.request.urlopen(f"{relay.http_url}/metrics", timeout=5, context=context) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{name}_total" and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def log_entries(daemon: Daemon, message: str) -> list[dict]:
    entries = []
    for line in daemon.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("msg") == message:
            entries.append(entry)
    return entries


def restart_master(grid: Grid, *extra: str) -> None:
    assert grid.master is not None
    grid.master.kill(signal.SIGTERM)
    grid.start_master(*extra)
    for relay in grid.relays.values():
        wait_for(lambda relay=relay: grid.relay_health(relay)["master_link"] == "up", 45, f"{relay.relay_id} to link up again")


def restart_relay(grid: Grid, relay_id: str) -> None:
    relay = grid.relays[relay_id]
    assert relay.daemon is not None
    relay.daemon.kill(signal.SIGTERM)
    grid.start_relay(relay_id, relay.region)


async def wait_closed_by(ws: ClientConnection, deadline: float) -> None:
    await asyncio.wait_for(ws.wait_closed(), timeout=max(0.0, deadline - time.monotonic()))


# --- 1. renewal --------------------------------------------------------------------------------


async def test_an_agent_renews_its_certificate_on_its_open_connection_and_uses_it_for_the_next(tmp_path):
    grid, config = await asyncio.to_thread(short_lived_grid, tmp_path, 24.0)
    try:
        agent_id = await asyncio.to_thread(enroll, grid, "renewer")
        first_pair = keep_pair(grid, "renewer", tmp_path / "first")
        daemon = grid.start_agent("renewer", simulate="l4:1")
        first = await asyncio.to_thread(grid.wait_state, agent_id, "ready")
        assert first["cert_serial"] == serial_of(first_pair)

        renewed = await asyncio.to_thread(
            wait_for,
            lambda: (a := grid.agent(agent_id))["cert_serial"] != first["cert_serial"] and a,
            30,
            "the Master to record a renewed certificate",
        )
        renewed_not_after, first_not_after = instant(renewed["cert_not_after"]), instant(first["cert_not_after"])
        assert renewed_not_after is not None and first_not_after is not None and renewed_not_after > first_not_after
        state_dir = grid.agent_dir("renewer")
        await asyncio.to_thread(
            wait_for, lambda: serial_of(state_dir) != serial_of(first_pair), 10, "the agent to store its new certificate"
        )
        for file in ("agent.key", "agent.crt"):
            assert (state_dir / file).stat().st_mode & 0o777 == 0o600
        assert (state_dir / "agent.key").read_bytes() != (first_pair / "agent.key").read_bytes()  # a fresh key

        # The first certificate expires while the session it opened is still up: the relay adopted the new one.
        await asyncio.sleep(max(0.0, first_not_after + EXPIRY_SWEEP_S + 1.5 - time.time()))
        now = await asyncio.to_thread(grid.agent, agent_id)
        assert now["state"] == "ready"
        assert now["connected_since"] == first["connected_since"]  # no new hello, so no new connection
        assert len(log_entries(daemon, "connected to relay")) == 1
        assert len(log_entries(daemon, "certificate renewed")) >= 1
        relay = grid.relays["relay-1"]
        relay_daemon = relay.daemon
        assert relay_daemon is not None
        assert [e["agent"] for e in log_entries(relay_daemon, "agent connected")] == [agent_id]
        assert relay_counter(grid, relay, "idlegrid_access_connections_refused", reason="expired") == 0
        assert await refused(relay.agent_url, context_for(first_pair))  # the first certificate is no use any more

        # The next connection presents the renewed certificate.
        daemon.kill()
        latest = serial_of(state_dir)
        grid.start_agent("renewer", simulate="l4:1")
        await asyncio.to_thread(
            wait_for,
            lambda: any(e["serial"] == latest for e in log_entries(relay_daemon, "agent connected")),
            20,
            "the agent to reconnect with its renewed certificate",
        )
        await asyncio.to_thread(grid.wait_state, agent_id, "ready")
    finally:
        grid.stop()


async def test_the_relay_refuses_an_expired_certificate_and_cuts_one_that_expires_in_session(grid, tmp_path):
    relay = grid.relays["relay-1"]
    agent_id = await asyncio.to_thread(enroll, grid, "lapsed")
    ca = grid.authority.ca

    def pair(name: str, **validity: float) -> Path:
        key = generate_key()
        cert = ca.issue(CertRole.AGENT, agent_id, key.public_key(), **validity)
        out = keep_pair(grid, "lapsed", tmp_path / name)
        write_private_key(out / "agent.key", key_to_pem(key))
        (out / "agent.crt").write_bytes(cert.public_bytes(Encoding.PEM))
        return out

    assert await refused(relay.agent_url, context_for(pair("expired", valid_s=60, now=time.time() - 3600)))

    async with connect(relay.agent_url, ssl=context_for(pair("brief", valid_s=3)), open_timeout=5) as ws:
        await asyncio.wait_for(ws.wait_closed(), timeout=3 + EXPIRY_SWEEP_S + 3)
        assert ws.close_code == 4003 and "expired" in (ws.close_reason or "")
    assert relay_counter(grid, relay, "idlegrid_access_connections_refused", reason="expired") >= 1


# --- 2. revocation -----------------------------------------------------------------------------


async def test_revocation_covers_every_valid_certificate_on_every_relay_across_restarts(tmp_path):
    grid, config = await asyncio.to_thread(short_lived_grid, tmp_path, 120.0, ("relay-1", "eu-west"), ("relay-2", "us-east"))
    try:
        r1, r2 = grid.relays["relay-1"], grid.relays["relay-2"]
        # A renews early, so it holds two valid certificates: its first (kept, as a stale backup would) and its new one.
        a_id = await asyncio.to_thread(enroll, grid, "a")
        a_first = keep_pair(grid, "a", tmp_path / "a-first")
        (tmp_path / "agent.toml").write_text("cert_renew_fraction = 0.1\n")
        a_daemon = grid.start_agent("a", "--config", str(tmp_path / "agent.toml"), simulate="l4:1")
        await asyncio.to_thread(
            wait_for,
            lambda: grid.agent(a_id)["cert_serial"] not in ("", serial_of(a_first)),
            40,
            "a to renew",
        )
        b_id = await asyncio.to_thread(enroll, grid, "b")
        c_id = await asyncio.to_thread(enroll, grid, "c")  # never revoked: refusals must be about A and B only
        b_pair, c_pair = keep_pair(grid, "b", tmp_path / "b"), keep_pair(grid, "c", tmp_path / "c")

        await asyncio.to_thread(restart_master, grid, "--config", str(config))  # revocations start from the store

        first_on_r2 = await connect(r2.agent_url, ssl=context_for(a_first), open_timeout=5)
        await asyncio.to_thread(wait_for, lambda: grid.agent(a_id)["state"] == "ready", 20, "a to be back")
        refused_before = relay_counter(grid, r1, "idlegrid_access_connections_refused", reason="revoked")
        started = time.monotonic()
        status, _ = await asyncio.to_thread(grid.call, "POST", f"/api/v1/agents/{a_id}/revoke")
        assert status == 200
        await wait_closed_by(first_on_r2, started + REVOCATION_DEADLINE_S)  # relay-2: the old certificate
        assert "revoked" in (first_on_r2.close_reason or "")
        await asyncio.to_thread(  # relay-1: the agent's session with its renewed certificate
            wait_for,
            lambda: relay_counter(grid, r1, "idlegrid_access_connections_refused", reason="revoked") > refused_before,
            max(0.1, started + REVOCATION_DEADLINE_S - time.monotonic()),
            "relay-1 to cut a off",
            0.05,
        )
        a_daemon.kill()
        a_latest = keep_pair(grid, "a", tmp_path / "a-latest")
        assert serial_of(a_latest) != serial_of(a_first)

        # B is revoked while relay-2 is down: relay-2 learns it when it links up again.
        assert r2.daemon is not None
        await asyncio.to_thread(r2.daemon.kill, signal.SIGTERM)
        status, _ = await asyncio.to_thread(grid.call, "POST", f"/api/v1/agents/{b_id}/revoke")
        assert status == 200
        await asyncio.to_thread(grid.start_relay, "relay-2", "us-east")
        # Both restarted: relay-1 knows only what the Master read back from its store.
        await asyncio.to_thread(restart_master, grid, "--config", str(config))
        await asyncio.to_thread(restart_relay, grid, "relay-1")

        for relay in (r1, r2):
            for pair in (a_first, a_latest, b_pair):
                assert await refused(relay.agent_url, context_for(pair)), (relay.relay_id, pair.name)
            assert not await refused(relay.agent_url, context_for(c_pair)), relay.relay_id
        assert (await asyncio.to_thread(grid.agent, a_id))["state"] == "retired"
        assert (await asyncio.to_thread(grid.agent, c_id))["state"] != "retired"
    finally:
        grid.stop()


# --- 3. signing-key rotation ---------------------------------------------------------------------


class ResigningRelay(TamperingRelay):
    """The rogue relay of tests/support/tamper.py, re-signing the next command with a key the test holds."""

    signer: CommandSigner | None = None

    def resign_next_command_with(self, signer: CommandSigner) -> None:
        self.signer = signer
        self.tamper_next_command()

    def _maybe_tamper(self, message: str | bytes) -> str | bytes:
        frame = json.loads(message)
        if frame.get("type") != "command" or not self._armed.is_set() or self.signer is None:
            return message
        self._armed.clear()
        body = msgspec.convert(frame["body"], CommandBody)
        body.key_id = self.signer.key_id
        self.tampered.append(body.id)
        return json.dumps(
            {"type": "command", "body": msgspec.to_builtins(body), "signature": self.signer.sign(signing_bytes(body))}
        )


def agent_keys(grid: Grid, name: str) -> dict:
    return json.loads((grid.agent_dir(name) / "identity.json").read_text())


async def test_a_rotated_key_reaches_connected_agents_and_a_retired_key_signs_nothing_they_run(grid, tmp_path):
    agent_id = await asyncio.to_thread(enroll, grid, "rot")
    rogue = ResigningRelay(grid, grid.relays["relay-1"].agent_url, grid.agent_dir("rot"))
    rogue.start()
    try:
        daemon = grid.start_agent("rot", "--access", rogue.agent_url, simulate="a10:1")
        await asyncio.to_thread(grid.wait_state, agent_id, "ready")
        keys = (await asyncio.to_thread(grid.get, "/api/v1/signing-keys"))["items"]
        old = next(k["key_id"] for k in keys if k["state"] == "current")

        status, rotated = await asyncio.to_thread(grid.call, "POST", "/api/v1/signing-keys/rotate")
        assert status == 201, rotated
        new = rotated["key_id"]
        await asyncio.to_thread(
            wait_for, lambda: new in agent_keys(grid, "rot")["command_keys"], 10, "the agent to learn the new key"
        )

        ran = tmp_path / "ran-new"
        spec = {"name": "signed-new", "image": "none", "command": ["sh", "-c", f"touch {ran}; sleep 30"]}
        result = await asyncio.to_thread(
            grid.wait_command, await asyncio.to_thread(grid.command, agent_id, "create_container", spec)
        )
        assert result["state"] == "succeeded" and result["key_id"] == new, result
        assert ran.exists()

        status, retired = await asyncio.to_thread(grid.call, "POST", f"/api/v1/signing-keys/{old}/retire")
        assert status == 200 and retired["state"] == "retired", retired
        await asyncio.to_thread(
            wait_for, lambda: old in agent_keys(grid, "rot")["retired_keys"], 10, "the agent to learn the key is retired"
        )
        assert old not in agent_keys(grid, "rot")["command_keys"]

        # A command signed (validly) with the retired key, loaded from the Master's own pki directory.
        retired_signer = SigningKeyRing.open(grid.master_dir / "pki", grid.authority.ca).signer(old)
        rogue.resign_next_command_with(retired_signer)
        witness = tmp_path / "ran-retired"
        spec = {"name": "signed-old", "image": "none", "command": ["sh", "-c", f"touch {witness}; sleep 30"]}
        command_id = await asyncio.to_thread(grid.command, agent_id, "create_container", spec)
        result = await asyncio.to_thread(grid.wait_command, command_id)
        assert rogue.tampered == [command_id]
        assert result["state"] == "failed" and "retired" in result["error"], result
        assert not witness.exists()

        # All of it without reconnecting.
        assert rogue.connections == 1
        assert len(log_entries(daemon, "connected to relay")) == 1
    finally:
        rogue.stop()


# --- 4. no agent speaks for another ------------------------------------------------------------


async def test_an_agent_naming_another_in_every_field_changes_nothing_of_the_other(grid, tmp_path):
    relay = grid.relays["relay-1"]
    a_id, b_id = await asyncio.to_thread(enroll, grid, "a"), await asyncio.to_thread(enroll, grid, "b")
    b_daemon = grid.start_agent("b", simulate="a10:2")
    await asyncio.to_thread(grid.wait_state, b_id, "ready")
    b_daemon.kill()
    await asyncio.to_thread(grid.wait_state, b_id, "offline")
    witness = tmp_path / "b-ran"
    spec = {"name": "b-job", "image": "none", "command": ["sh", "-c", f"echo {b_id} > {witness}; sleep 30"]}
    b_command = await asyncio.to_thread(grid.command, b_id, "create_container", spec)  # pending: B is away
    b_before = await asyncio.to_thread(grid.agent, b_id)
    b_events_before = (await asyncio.to_thread(grid.get, f"/api/v1/events?subject={b_id}&limit=1000"))["items"]
    b_gpus = [g["uuid"] for g in b_before["gpus"]]

    forged_host = HostInfo(
        hostname=b_id, cpu_model=b_id, cpu_cores=1, ram_mib=1024, disk_total_gib=1, disk_free_gib=1, os=b_id, kernel=b_id
    )
    forged_gpus = [
        msgspec.structs.replace(g, uuid=u) for g, u in zip(SimulatedCollector("a10:2", host_key=b_id).inventory(), b_gpus)
    ]
    csr_for_b = make_csr(generate_key(), b_id).decode()
    frames = [
        Hello(
            versions=[1],
            agent_version=b_id,
            inventory=Inventory(host=forged_host, gpus=forged_gpus),
            region=b_id,
            command_keys=[b_id],
        ),
        Heartbeat(seq=1, ts=time.time(), running=["b-job"], ping=b_id),
        Telemetry(ts=time.time(), samples=[GpuSample(uuid=u, ts=time.time(), utilization_pct=99.5) for u in b_gpus]),
        CommandAck(id=b_command),
        CommandResult(id=b_command, ok=True, result={"agent_id": b_id}),
        AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=b_gpus[0], code=79, message=b_id),
        RenewRequest(csr_pem=csr_for_b),
    ]
    async with connect(relay.agent_url, ssl=context_for(keep_pair(grid, "a", tmp_path / "a")), open_timeout=5) as ws:
        received: list[dict] = []

        async def until(kind: str) -> dict:
            while not any(f["type"] == kind for f in received):
                received.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=10)))
            return next(f for f in received if f["type"] == kind)

        for frame in frames:
            doc = json.loads(encode(frame))
            doc["agent_id"] = b_id  # an extra field naming B, in every frame
            await ws.send(json.dumps(doc))
            if isinstance(frame, Hello):
                assert (await until("welcome"))["agent_id"] == a_id
        await ws.send(json.dumps({"type": "relay", "agent_id": b_id, "frame": {"type": "heartbeat", "seq": 2, "ts": 1.0}}))
        renewed = await until("renew_response")
        assert identity_of(load_cert(renewed["cert_pem"].encode())).id == a_id  # named from the link, not the CSR
        assert (await until("error"))["code"] == "unknown_type"

    b_after = await asyncio.to_thread(grid.agent, b_id)
    for field in ("state", "cert_serial", "cert_not_after", "region", "host", "connected_since", "containers"):
        assert b_after[field] == b_before[field], field
    assert [(g["uuid"], g["state"]) for g in b_after["gpus"]] == [(g["uuid"], g["state"]) for g in b_before["gpus"]]
    assert all((g["telemetry"] or {}).get("utilization_pct") != 99.5 for g in b_after["gpus"])
    assert (await asyncio.to_thread(grid.get, f"/api/v1/events?subject={b_id}&limit=1000"))["items"] == b_events_before
    command = await asyncio.to_thread(grid.get, f"/api/v1/commands/{b_command}")
    assert (command["state"], command["attempts"], command["result"]) == ("pending", 0, None)
    a_now = await asyncio.to_thread(grid.agent, a_id)
    # B's GPUs stay B's: what A claimed shows on A only as flagged copies, offline, never offered.
    assert [(g["uuid"], g["state"], g["flags"]) for g in a_now["gpus"]] == [(u, "offline", ["duplicate_uuid"]) for u in b_gpus]
    listed = (await asyncio.to_thread(grid.get, "/api/v1/gpus"))["items"]
    # The fleet list shows both claims of each UUID, B's and A's flagged copy; A's copy is never offered, and B's GPUs
    # are not offered only because B is away (docs/master.md, "What the Master trusts from an agent").
    claims = [g for g in listed if g["uuid"] in b_gpus]
    assert sorted(g["agent_id"] for g in claims) == sorted([a_id, a_id, b_id, b_id])
    assert not any(g["offered"] for g in claims)
    forged_events = (await asyncio.to_thread(grid.get, f"/api/v1/events?subject={a_id}&kind=agent.transition&limit=1000"))[
        "items"
    ]
    assert all(e["subject"] == a_id for e in forged_events)

    # B itself, back, gets and runs its command.
    grid.start_agent("b", simulate="a10:2")
    result = await asyncio.to_thread(grid.wait_command, b_command)
    assert result["state"] == "succeeded", result
    assert result["result"]["container"]["labels"]["io.idlegrid.agent-id"] == b_id
