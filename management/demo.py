"""``idlegrid demo``: a whole grid on this machine, each part its own process, on the embedded store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from common.pki import Role
from master.authority import Authority

# Two regions, one relay each; agents alternate between them.
RELAYS = (("relay-a", "eu-west"), ("relay-b", "us-east"))
# A mix of GPU models, as a marketplace would see them.
FLEET = ("h100:8", "a100-80gb:4", "l40s:4", "rtx-4090:2", "a10:1", "t4:4", "rtx-3090:2", "h200:8", "l4:2", "v100:4")
STARTUP_TIMEOUT_S = 30.0


@dataclass
class RelayPorts:
    relay_id: str
    region: str
    agent_port: int
    http_port: int

    @property
    def agent_url(self) -> str:
        return f"wss://127.0.0.1:{self.agent_port}"

    @property
    def http_url(self) -> str:
        return f"https://127.0.0.1:{self.http_port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    def __init__(self, state_dir: Path, api_port: int, agents: int) -> None:
        self.state_dir = state_dir.resolve()
        self.api_port = api_port
        self.agents = agents
        self.processes: list[asyncio.subprocess.Process] = []
        self.master_dir = self.state_dir / "master"
        self.logs = self.state_dir / "logs"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    async def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        authority = Authority.open(self.master_dir)
        link_port = free_port()
        await self._spawn(
            "master",
            "master",
            "--state-dir",
            str(self.master_dir),
            "--api-port",
            str(self.api_port),
            "--link-port",
            str(link_port),
        )
        await self._wait(lambda: _get(f"{self.api_url}/healthz"), "the Master's API")
        relays = [RelayPorts(rid, region, free_port(), free_port()) for rid, region in RELAYS]
        context = ssl.create_default_context(cafile=str(authority.ca_file))
        for relay in relays:
            cert, key, ca = authority.write_server_identity(
                self.state_dir / "relays" / relay.relay_id, Role.ACCESS, relay.relay_id
            )
            await self._spawn(
                relay.relay_id,
                "access",
                "--relay-id",
                relay.relay_id,
                "--region",
                relay.region,
                "--master-url",
                f"wss://127.0.0.1:{link_port}/link",
                "--agent-port",
                str(relay.agent_port),
                "--http-port",
                str(relay.http_port),
                "--cert",
                str(cert),
                "--key",
                str(key),
                "--ca",
                str(ca),
            )
        for relay in relays:
            await self._wait(lambda r=relay: _get(f"{r.http_url}/healthz", context)["master_link"] == "up", relay.relay_id)
        await asyncio.gather(*(self._start_agent(i, relays[i % len(relays)], authority.ca_file) for i in range(self.agents)))

    async def _start_agent(self, i: int, relay: RelayPorts, ca_file: Path) -> None:
        name = f"agent-{i:02d}"
        agent_dir = self.state_dir / "agents" / name
        if not (agent_dir / "identity.json").exists():
            token = await asyncio.to_thread(self._join_token)
            enroll = await self._spawn(
                f"{name}-enroll",
                "agent",
                "--state-dir",
                str(agent_dir),
                "--region",
                relay.region,
                "enroll",
                "--token",
                token,
                "--access",
                relay.http_url,
                "--ca-file",
                str(ca_file),
                "--connect",
                relay.agent_url,
                keep=False,
            )
            if await enroll.wait() != 0:
                raise RuntimeError(f"{name} could not enroll; see {self.logs / (name + '-enroll.log')}")
        await self._spawn(
            name,
            "agent",
            "--state-dir",
            str(agent_dir),
            "--region",
            relay.region,
            "--simulate",
            FLEET[i % len(FLEET)],
            "--runtime",
            "process",
        )

    def _join_token(self) -> str:
        key = (self.master_dir / "operator.token").read_text().strip()
        request = urllib.request.Request(
            f"{self.api_url}/api/v1/tokens",
            method="POST",
            data=json.dumps({"provider": "demo-provider"}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["token"]

    async def _spawn(self, name: str, *args: str, keep: bool = True) -> asyncio.subprocess.Process:
        log = open(self.logs / f"{name}.log", "ab")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "management.cli",
            *args,
            stdout=log,
            stderr=log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops the children in order
        )
        log.close()
        if keep:
            self.processes.append(process)
        return process

    async def _wait(self, probe, what: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if await asyncio.to_thread(probe):
                    return
            if any(p.returncode is not None for p in self.processes):
                break
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{what} did not come up; logs are in {self.logs}")

    async def stop(self) -> None:
        """Agents first, then relays, then the Master: each gets SIGTERM, then SIGKILL after 5 s."""
        for process in reversed(self.processes):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        kill_processes_under(self.state_dir)


def kill_processes_under(root: Path) -> None:
    """Process-runtime containers outlive their agent by design; stopping the demo stops them too."""
    root_text = str(root.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(root_text):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def _get(url: str, context: ssl.SSLContext | None = None) -> dict:
    with urllib.request.urlopen(url, timeout=2, context=context) as response:
        return json.loads(response.read())


async def run_demo(state_dir: Path, *, api_port: int, agents: int) -> int:
    demo = Demo(state_dir, api_port, agents)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await demo.start()
        token_file = demo.master_dir / "operator.token"
        (demo.state_dir / "operator.token").write_text(token_file.read_text())
        (demo.state_dir / "operator.token").chmod(0o600)
        print(f"idlegrid demo is up: {agents} simulated agents, 2 relays, 1 master", flush=True)
        print(f"  API:            {demo.api_url}/api/v1/agents", flush=True)
        print(f"  operator token: {demo.state_dir / 'operator.token'}", flush=True)
        print(
            f'  try:            curl -H "Authorization: Bearer $(cat {demo.state_dir / "operator.token"})" '
            f"{demo.api_url}/api/v1/agents",
            flush=True,
        )
        print("  Ctrl-C stops everything.", flush=True)
        await stop.wait()
        return 0
    except RuntimeError as exc:
        print(f"idlegrid demo: {exc}", file=sys.stderr)
        return 1
    finally:
        await demo.stop()
