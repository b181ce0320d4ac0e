"""``idlegrid demo``: a whole grid on this machine, each part its own process, on the embedded store.

One Master, two relays in two regions and simulated agents with a mix of GPU models, started by the local-grid
launcher. Started again on the same state directory it comes back as it was: same ports, same agents (enrolled
once). It says "up" only when the API shows every agent connected in this run, and Ctrl-C stops agents, relays,
then the Master.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from management.localgrid import PORTS_FILE, LocalGrid, RelayInfo, StartupFailed

# Two regions, one relay each; agents alternate between them.
RELAYS = (("relay-a", "eu-west"), ("relay-b", "us-east"))
# A mix of GPU models, as a marketplace would see them.
FLEET = ("h100:8", "a100-80gb:4", "l40s:4", "rtx-4090:2", "a10:1", "t4:4", "rtx-3090:2", "h200:8", "l4:2", "v100:4")
DEFAULT_API_PORT = 7000
DEFAULT_AGENTS = 8
PROVIDER = "demo-provider"
READY_TIMEOUT_S = 30.0


class Interrupted(BaseException):  # not an Exception: no "not up yet" retry loop may swallow it
    """SIGINT or SIGTERM: stop the demo in order."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def agent_name(index: int) -> str:
    return f"agent-{index:02d}"


class Demo:
    def __init__(self, state_dir: Path, *, api_port: int | None, agents: int) -> None:
        first_run = not (state_dir / PORTS_FILE).exists()
        self.grid = LocalGrid(state_dir, api_port=api_port if api_port is not None or not first_run else DEFAULT_API_PORT)
        self.agents = agents

    def start(self) -> list[str]:
        """Master, relays, then the agents (enrolled the first time); the agent ids once all are ready."""
        started = time.time()
        # The demo's hosts run the process runtime (no container engine needed): the operator allows offering them.
        self.grid.start_master(env={"IDLEGRID_MASTER_OFFER_SANDBOXED_HOSTS": "true"})
        relays = [self.grid.start_relay(relay_id, region) for relay_id, region in RELAYS]
        with ThreadPoolExecutor(max_workers=max(1, self.agents)) as pool:
            ids = list(pool.map(lambda i: self._start_agent(i, relays[i % len(relays)]), range(self.agents)))
        self.grid.wait_agents_ready(ids, since=started, timeout_s=READY_TIMEOUT_S)
        return ids

    def _start_agent(self, index: int, relay: RelayInfo) -> str:
        name = agent_name(index)
        if not self.grid.enrolled(name):
            token = self.grid.join_token(PROVIDER)
            done = self.grid.enroll(name, relay, token, region=relay.region)
            if done.returncode != 0:
                reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise StartupFailed(f"{name} could not enroll: {reason}")
        # The relay's URL as of this run, whatever the agent recorded at enrollment (a state directory from before
        # ports were kept would otherwise send it to a port nobody listens on).
        flags = ("--region", relay.region, "--runtime", "process", "--access", relay.agent_url)
        self.grid.start_agent(name, *flags, simulate=FLEET[index % len(FLEET)])
        return self.grid.agent_id(name)

    def banner(self) -> str:
        grid = self.grid
        key = grid.root / "operator.token"
        relays = "\n".join(
            f"    {r.relay_id} ({r.region}): agents {r.agent_url}   enrollment {r.http_url}" for r in grid.relays.values()
        )
        first = next(iter(grid.relays.values()))
        idlegrid = idlegrid_command()
        return "\n".join(
            [
                f"idlegrid demo is up: {self.agents} simulated agents ready, {len(grid.relays)} relays, 1 Master",
                f"  API:             {grid.api_url}/api/v1/agents",
                f"  operator key:    {key}",
                "  relays:",
                relays,
                f"  CA file:         {grid.ca_file}",
                f'  enroll a host:   {idlegrid} agent enroll --state-dir DIR --token "$({idlegrid} token create '
                f'--provider {PROVIDER} --api {grid.api_url} --operator-token-file {key})" '
                f"--access {first.http_url} --ca-file {grid.ca_file}",
                f'  try:             curl -H "Authorization: Bearer $(cat {key})" {grid.api_url}/api/v1/agents',
                f"  logs:            {grid.logs}",
                "  Ctrl-C stops everything.",
            ]
        )

    def publish_operator_key(self) -> None:
        """The operator key beside the state directory's other files, 0600, where the banner says it is."""
        key = self.grid.root / "operator.token"
        key.write_text(self.grid.operator_key_file.read_text())
        key.chmod(0o600)


def idlegrid_command() -> str:
    """How to call ``idlegrid`` from this shell: the name when it is on PATH, else the one beside this Python
    (scripts/demo runs it from .venv/bin without activating the environment)."""
    if shutil.which("idlegrid"):
        return "idlegrid"
    beside = Path(sys.executable).parent / "idlegrid"
    return str(beside) if beside.exists() else f"{sys.executable} -m management.cli"


def run_demo(state_dir: Path, *, api_port: int | None, agents: int) -> int:
    """Run until SIGINT or SIGTERM; errors (a port in use, a process that does not come up) raise IdlegridError."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    demo: Demo | None = None
    try:
        demo = Demo(state_dir, api_port=api_port, agents=agents)
        demo.start()
        demo.publish_operator_key()
        print(demo.banner(), flush=True)
        while True:
            signal.pause()
    except Interrupted:
        return 0
    finally:
        # A second Ctrl-C must not cut the orderly stop short: agents, relays, then the Master.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if demo is not None:
            demo.grid.stop()
            print("idlegrid demo: stopped", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
