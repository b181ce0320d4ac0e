"""``idlegrid demo``: a whole grid on this machine, each part its own process, on the embedded store.

One Master, two relays in two regions and simulated agents with a mix of GPU models, started by the local-grid
launcher. Started again on the same state directory it comes back as it was: same ports, same agents (enrolled
once). It says "up" only when the API shows every agent connected in this run, and Ctrl-C stops agents, relays,
then the Master.

It is a marketplace too: the Master offers the agents' sandboxed hosts to renters (a real Master does not unless
its operator says so), and the demo keeps a renter account, ``demo-renter``, whose API key it writes beside the
operator's (``renter.token``, 0600). Its provider's hosts are priced (DEMO_PRICES per GPU-hour) and the renter is
credited once (RENTER_CREDIT), so renting costs money and the ledger shows every cent. The banner shows the commands a
renter types to search offers, rent one, read its balance and ledger, and submit, list, show, explain and cancel a
workload.

Its gangs get their overlay network where the machine allows it (root and the tools ``lighthouse_unavailable`` checks):
a lighthouse in a network namespace of its own (management/devgrid/lighthouse.py), listed in the Master's ``[overlay]``
(``master.toml``, written at every start with the lighthouse's endpoint of that run), issued from the Master's overlay
CA once the Master is up and closed by the grid's stop. Elsewhere the banner says why gangs have no overlay.

Where podman, runc and busybox-static are installed it has a container host too: one more agent, on the docker
runtime against a Podman service of the demo's own (management/devgrid/podman_host.py), its storage under the state
directory (``podman/``) and kept between runs, so its images (the GPU self-test's and DEMO_IMAGE, a web page) are built
on the first run only. No registry is reachable, so that host pulls nothing and says so in its hello: the Master then
refuses at submit the shipped templates (docker.io images) and takes the demo's own, ``hello-web`` (TEMPLATES_DIR).
Where Podman is missing or fails, the demo comes up without it and the banner says why.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from common.files import write_atomically
from management.client.api import ApiClient, ApiError
from management.devgrid import object_store
from management.devgrid.carried_worker import SYSTEM_PYTHON, carried_worker
from management.devgrid.lighthouse import LIGHTHOUSE_ADDRESS, lighthouse_unavailable, overlay_toml
from management.devgrid.localgrid import PORTS_FILE, Daemon, LocalGrid, RelayInfo, StartupFailed, kill_processes_under
from management.devgrid.object_store import ObjectStore
from management.devgrid.podman_host import DEMO, DEMO_IMAGE, SELFTEST, PodmanHost, PodmanUnavailable

# Two regions, one relay each; agents alternate between them.
RELAYS = (("relay-a", "eu-west"), ("relay-b", "us-east"))
# A mix of GPU models and vendors, as a marketplace would see them: the second host is AMD's (docs/gpus.md), so even a
# two-agent demo has one.
FLEET = (
    "h100:8",
    "mi300x:8",
    "a100-80gb:4",
    "l40s:4",
    "rtx-4090:2",
    "a10:1",
    "t4:4",
    "rtx-3090:2",
    "h200:8",
    "l4:2",
    "v100:4",
    "w7900:2",
)
DEFAULT_API_PORT = 7000
DEFAULT_AGENTS = 8
PROVIDER = "demo-provider"
RENTER = "demo-renter"
OPERATOR_KEY_FILE = "operator.token"
RENTER_KEY_FILE = "renter.token"
CONSOLE_PASSWORDS_FILE = "console.passwords"  # "ACCOUNT PASSWORD" lines, 0600: the demo accounts' console passwords
OPERATOR = "operator"  # the Master's bootstrap operator account
CHANGED = "(changed in the console; not known to the demo)"
DEMO_PRICES = {"on_demand": "1.20", "min_bid": "0.40", "reserved_discount": 0.25}  # per GPU-hour
RENTER_CREDIT = "25.00"  # the renter's first credit (once per state directory)
UNISOLATED = "none"  # the isolation the demo's process-runtime hosts report when the demo does not run as root
READY_TIMEOUT_S = 30.0
MASTER_CONFIG_FILE = "master.toml"  # the Master's [overlay], rewritten at every start with this run's lighthouse
# What a renter pastes to see a gang meet over its overlay: rank 0 serves a file on MASTER_PORT, rank 1 fetches it from
# MASTER_ADDR (retrying until the overlay's tunnel is up) and prints it; each prints its place in the gang first.
# Debian's python3, which the sandboxed replica's uid runs (the demo's own Python may live in a directory it cannot read).
GANG_COMMAND = (
    """sh -c 'echo "rank $RANK of $WORLD_SIZE, rank 0 at $MASTER_ADDR:$MASTER_PORT"; """
    """if [ "$RANK" = 0 ]; then echo "hello from rank 0 at $MASTER_ADDR" > hello; """
    """exec python3 -m http.server "$MASTER_PORT"; fi; """
    """until python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=3).read().decode())" """
    """"http://$MASTER_ADDR:$MASTER_PORT/hello"; do sleep 1; done'"""
)
# The banner's checkpointed job: counts to 600, a step a second, and resumes from the last step its checkpoint kept.
COUNTER = (
    'n=$(cat "$IDLEGRID_CHECKPOINT_DIR/n" 2>/dev/null || echo 0); while [ "$n" -lt 600 ]; do n=$((n+1)); '
    'echo "$n" > "$IDLEGRID_CHECKPOINT_DIR/n"; echo "step $n"; sleep 1; done'
)
# The container host: an agent on the docker runtime against a Podman service of the demo's own (podman_host.py),
# whose images are built on this machine, since no registry is reachable: it pulls nothing, and says so in hello.
CONTAINER_HOST = "podman-host"
CONTAINER_HOST_GPUS = "l4:2"
# The container host is ready once its GPUs' self-test ran, one container per GPU in turn, each bounded: on a loaded
# machine the first containers on a cold Podman can take most of a minute (a fresh-clone CI saw more than 30 s). Under
# load runc fails now and then ("can't get final child's PID"): the agent tries such a container again at once, and
# tests a GPU that still failed so again SELFTEST_RETEST_S later, then twice as long each time (agent/daemon.py). The
# demo waits for its GPUs to be offered until CONTAINER_HOST_DEADLINE_S after its start (its e2e test waits 180 s for
# "up", images built first); then it comes up, its banner naming any GPU still not offered and why.
SELFTEST_TIMEOUT_S = 30
SELFTEST_RETEST_S = 5
CONTAINER_HOST_DEADLINE_S = 150.0
GPU_POLL_S = 0.5  # how often the demo asks whether its container host's GPUs are offered
PODMAN_DIR = "podman"
# Its containers' network: slirp4netns, not CNI's bridge, whose namespace files in /run/netns a process-runtime host's
# new sandbox (unshare --mount) now and then hides from the CNI plugin while podman makes one (podman_host.py); the
# process runtime's sandboxes use slirp4netns already.
CONTAINER_NETNS = "slirp4netns"
# The renter's serverless endpoint: an echo worker on a process host, 0 to 2 of them, each serving 4 requests at once.
ENDPOINT_NAME = "echo"
ENDPOINT_IDLE_S = 60
ENDPOINT_SPEC = {
    "name": ENDPOINT_NAME,
    "image": "none",
    "constraints": {"allow_process_runtime": True},
    "scaling": {"min_workers": 0, "max_workers": 2, "idle_timeout_s": ENDPOINT_IDLE_S, "concurrency": 4},
}
TEMPLATES_DIR = Path(__file__).parent / "templates"  # the demo Master's operator templates: hello-web, on DEMO_IMAGE
DEMO_TEMPLATE = "hello-web"
LOCAL_IMAGES = "localhost"  # the egress rule refuses the local images' registry name unless allowed by name
MASTER_ENV = {
    # The demo's simulated hosts run the process runtime (no container engine needed): the operator allows offering
    # them. Renters may name the images built here, and the templates directory adds one that runs on them.
    "IDLEGRID_MASTER_OFFER_SANDBOXED_HOSTS": "true",
    "IDLEGRID_MASTER_EGRESS_ALLOW": LOCAL_IMAGES,
    "IDLEGRID_MASTER_TEMPLATES_DIR": str(TEMPLATES_DIR),
}
CONTAINER_HOST_ENV = {
    "IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": SELFTEST.reference,  # its default is on Docker Hub, out of reach
    "IDLEGRID_AGENT_EGRESS_ALLOW": LOCAL_IMAGES,
    "IDLEGRID_AGENT_IMAGE_PULL": "false",  # no registry is reachable: only the images built here run
    "IDLEGRID_AGENT_DOCKER_NETWORK": CONTAINER_NETNS,
    "IDLEGRID_AGENT_GPU_SELFTEST_TIMEOUT_S": str(SELFTEST_TIMEOUT_S),
    "IDLEGRID_AGENT_GPU_SELFTEST_RETEST_S": str(SELFTEST_RETEST_S),
}


class Interrupted(BaseException):  # not an Exception: no "not up yet" retry loop may swallow it
    """SIGINT or SIGTERM: stop the demo in order."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def agent_name(index: int) -> str:
    return f"agent-{index:02d}"


class Demo:
    def __init__(
        self,
        state_dir: Path,
        *,
        api_port: int | None,
        agents: int,
        container_host: bool = True,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.say = say  # progress for the person waiting (run_demo prints it): a cold first run is a minute or two
        first_run = not (state_dir / PORTS_FILE).exists()
        self.grid = LocalGrid(state_dir, api_port=api_port if api_port is not None or not first_run else DEFAULT_API_PORT)
        self.agents = agents
        self.unsandboxed: list[str] = []  # agents that cannot sandbox commands: the scheduler never places work there
        self.no_overlay = ""  # why the demo's gangs have no overlay ("" when its lighthouse runs)
        self.no_store = object_store.unavailable()  # why the demo has no object store, or ""
        self.store = None if self.no_store else ObjectStore.plan(self.grid)

        self.podman = PodmanHost(self.grid.root / PODMAN_DIR, netns=CONTAINER_NETNS) if container_host else None
        self.container_host_id: str | None = None
        self.no_container_host = "" if container_host else "turned off (--no-container-host)"
        self.unoffered: list[tuple[str, str]] = []  # the container host's GPUs not offered, and why (its self-test)
        self.images_built: list[str] = []  # built by this start (a later start on the same state directory keeps them)
        self._container_agent: Daemon | None = None
        self.endpoint_id: str | None = None  # the renter's endpoint (publish_endpoint)
        self.no_endpoint = "not made yet"

    def egress_allow(self) -> list[str]:
        """What the demo's operator and its hosts' provider allow renters to reach on this machine by name: the images
        built here (their registry name, localhost) and its object store."""
        return [LOCAL_IMAGES, *([self.store.allowed] if self.store is not None else [])]

    def start(self) -> list[str]:
        """The object store and the lighthouse's namespace, the Master, the lighthouse, relays, then the agents
        (enrolled the first time), Podman made ready meanwhile; the agent ids once all are ready. Podman missing or
        failing leaves the demo without its container host, saying why."""
        started = time.time()
        container_deadline = time.monotonic() + CONTAINER_HOST_DEADLINE_S
        engine_note = " and a container host (Podman)" if self.podman is not None else ""
        self.say(f"starting a Master, {len(RELAYS)} relays, {self.agents} simulated agents{engine_note} in {self.grid.root}")
        if self.store is not None:
            self.store.start(self.grid)  # waited for once the agents are up: it starts while they do
        config = self._overlay_config()
        with ThreadPoolExecutor(max_workers=self.agents + 3) as pool:
            engine = pool.submit(self._prepare_engine) if self.podman is not None else None
            self.grid.start_master(*config, env={**MASTER_ENV, "IDLEGRID_MASTER_EGRESS_ALLOW": ",".join(self.egress_allow())})
            if config:
                self.grid.run_lighthouse()  # the Master made the overlay CA it is issued from
            relays = [self.grid.start_relay(relay_id, region) for relay_id, region in RELAYS]
            relay = relays[self.agents % len(relays)]
            enrolled = pool.submit(self._enroll_container_host, engine, relay)
            agents = [pool.submit(self._start_agent, i, relays[i % len(relays)]) for i in range(self.agents)]
            container_host = pool.submit(lambda: self._start_container_host(relay) if enrolled.result() else None)
            ids = [agent.result() for agent in agents]
            self.container_host_id = container_host.result()
        self.grid.wait_agents_ready(ids, since=started, timeout_s=READY_TIMEOUT_S)
        if self.container_host_id is not None:
            left_s = max(0.0, container_deadline - time.monotonic())
            self.say(
                f"{len(ids)} simulated agents ready after {time.time() - started:.0f} s; waiting for the container host's "
                f"GPU self-test (at most {left_s:.0f} s more: a cold Podman's first containers are slow)"
            )
        self._wait_container_host(since=started, deadline=container_deadline)
        if self.store is not None:
            self.store.wait()
        self.unsandboxed = sorted(a["id"] for a in self.grid.client.list("/api/v1/agents") if a["isolation"] == UNISOLATED)
        return [*ids, *([self.container_host_id] if self.container_host_id else [])]

    def stop(self) -> None:
        """Agents, relays, the Master; the Podman service and its containers (its images are kept); then the process
        hosts' containers. Podman's go first: the sweep of processes under the state directory would SIGKILL its
        containers' processes (their root is in its storage) and leave Podman unable to remove them."""
        try:
            self.grid.stop_daemons()
        finally:
            self.grid.stop_lighthouse()
            if self.podman is not None:
                self.podman.stop_service()
            kill_processes_under(self.grid.root)

    def _prepare_engine(self) -> None:
        """Podman's private configuration, the images (built only when this state directory lacks them), the service."""
        assert self.podman is not None
        self.podman.configure()
        missing = [image for image in (SELFTEST, DEMO) if self.podman.image_id(image.reference) is None]
        if missing:
            names = ", ".join(image.reference for image in missing)
            self.say(f"building the container host's images here, once for this state directory: {names}")
        for image in missing:
            self.podman.build_image(image)
        self.images_built = [image.reference for image in missing]
        self.podman.start_service()

    def _enroll_container_host(self, engine: Future[None] | None, relay: RelayInfo) -> bool:
        """Once Podman serves, the container host enrolled (the first time); False, with the reason kept, when Podman
        could not start (or the demo has no container host)."""
        if engine is None:
            return False
        try:
            engine.result()
        except PodmanUnavailable as exc:
            self.no_container_host = f"Podman could not start here: {_one_line(str(exc))}"
            return False
        self._enroll(CONTAINER_HOST, relay)
        return True

    def _start_container_host(self, relay: RelayInfo) -> str:
        """The container host's agent, on the docker runtime against the demo's Podman service; its agent id."""
        assert self.podman is not None
        socket = ("--runtime", "docker", "--docker-socket", str(self.podman.socket_path))
        flags = ("--region", relay.region, *socket, "--access", relay.agent_url)
        self._container_agent = self.grid.start_agent(
            CONTAINER_HOST,
            *flags,
            simulate=CONTAINER_HOST_GPUS,
            env={**CONTAINER_HOST_ENV, "IDLEGRID_AGENT_EGRESS_ALLOW": ",".join(self.egress_allow())},
        )
        return self.grid.agent_id(CONTAINER_HOST)

    def _wait_container_host(self, *, since: float, deadline: float) -> None:
        """The container host ready and its GPUs offered, waited for until ``deadline`` (monotonic). Not ready by then:
        stopped and the reason kept, the demo comes up without it rather than not at all. Ready with a GPU its
        self-test still fails: kept, that GPU named in ``unoffered`` with the reason (the banner says it)."""
        if self.container_host_id is None:
            return
        try:
            self.grid.wait_agents_ready([self.container_host_id], since=since, timeout_s=max(1.0, deadline - time.monotonic()))
        except StartupFailed as exc:
            self._drop_container_agent()
            self.container_host_id = None
            self.no_container_host = f"its agent did not come up: {exc}"
            return
        self.unoffered = self._wait_gpus_offered(self.container_host_id, deadline)

    def _drop_container_agent(self) -> None:
        """Stop the container host's agent and forget it (the readiness wait must not count it as died)."""
        if self._container_agent is not None:
            try:
                self._container_agent.terminate()
            except subprocess.TimeoutExpired:  # stuck on its engine (a self-test container Podman does not end)
                self._container_agent.kill()
            self.grid.daemons.remove(self._container_agent)
            self._container_agent = None

    def _wait_gpus_offered(self, agent_id: str, deadline: float) -> list[tuple[str, str]]:
        """Until ``deadline`` (monotonic), while the agent tests again the GPUs whose self-test failed for a reason that
        passes (runc and CNI fail now and then on a loaded machine): the GPUs still failing then, each with why."""
        while True:
            failed = [(r["uuid"], r["detail"]) for r in self.grid.client.agent(agent_id)["gpu_selftest"] if not r["reachable"]]
            if not failed or time.monotonic() >= deadline:
                return failed
            time.sleep(GPU_POLL_S)

    def _overlay_config(self) -> tuple[str, ...]:
        """``--config`` naming the lighthouse in the Master's ``[overlay]``, once its namespace is made; () and the
        reason in ``no_overlay`` where it cannot run."""
        self.no_overlay = lighthouse_unavailable()
        if self.no_overlay:
            return ()
        try:
            lighthouse = self.grid.start_lighthouse()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            self.no_overlay = f"its lighthouse could not start: {exc}"
            if self.grid.lighthouse is not None:
                self.grid.lighthouse.close()
            return ()
        path = self.grid.root / MASTER_CONFIG_FILE
        write_atomically(path, overlay_toml(LIGHTHOUSE_ADDRESS, lighthouse.endpoint).encode())
        return ("--config", str(path))

    def _start_agent(self, index: int, relay: RelayInfo) -> str:
        name = agent_name(index)
        self._enroll(name, relay)
        # The relay's URL as of this run, whatever the agent recorded at enrollment (a state directory from before
        # ports were kept would otherwise send it to a port nobody listens on).
        flags = ("--region", relay.region, "--runtime", "process", "--access", relay.agent_url)
        env = {"IDLEGRID_AGENT_EGRESS_ALLOW": ",".join(self.egress_allow())}
        self.grid.start_agent(name, *flags, simulate=FLEET[index % len(FLEET)], env=env)
        return self.grid.agent_id(name)

    def _enroll(self, name: str, relay: RelayInfo) -> None:
        """Enroll agent ``name`` for the demo's provider, the first time only."""
        if self.grid.enrolled(name):
            return
        token = self.grid.join_token(PROVIDER)
        done = self.grid.enroll(name, relay, token, region=relay.region)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise StartupFailed(f"{name} could not enroll: {reason}")

    def banner(self) -> str:
        grid = self.grid
        key = grid.root / OPERATOR_KEY_FILE
        relays = "\n".join(
            f"    {r.relay_id} ({r.region}): agents {r.agent_url}   enrollment {r.http_url}" for r in grid.relays.values()
        )
        first = next(iter(grid.relays.values()))
        idlegrid = idlegrid_command()
        return "\n".join(
            [
                self.up_line(),
                f"  API:             {grid.api_url}/api/v1/agents",
                f"  links:           {grid.links_url}/w/WORKLOAD-PORT/   (workloads' web ports: their own listener)",
                f"  operator key:    {key}",
                f"  renter key:      {grid.root / RENTER_KEY_FILE}   (account {RENTER})",
                "  relays:",
                relays,
                f"  CA file:         {grid.ca_file}",
                *self.container_host_lines(),
                f'  enroll a host:   {idlegrid} agent enroll --state-dir DIR --token "$({idlegrid} token create '
                f'--provider {PROVIDER} --api {grid.api_url} --operator-token-file {key})" '
                f"--access {first.http_url} --ca-file {grid.ca_file}",
                f'  try:             curl -H "Authorization: Bearer $(cat {key})" {grid.api_url}/api/v1/agents',
                f"  logs:            {grid.logs}",
                self.overlay_line(),
                "",
                *self.renter_lines(),
                "",
                *self.console_lines(),
                "",
                "  Ctrl-C stops everything.",
            ]
        )

    def up_line(self) -> str:
        """What is up, and how many of the container host's GPUs its self-test still keeps from being offered."""
        hosts = f"{self.agents} simulated agents" + (" and 1 container host" if self.container_host_id else "")
        unoffered = f" ({_count(len(self.unoffered), 'GPU')} of it not offered: see below)" if self.unoffered else ""
        return f"idlegrid demo is up: {hosts} ready{unoffered}, {len(self.grid.relays)} relays, 1 Master"

    def overlay_line(self) -> str:
        """Where the gangs' lighthouse runs, or why gangs have no overlay and what to do about it."""
        lighthouse = self.grid.lighthouse
        if not self.no_overlay and lighthouse is not None and not lighthouse.alive():
            self.no_overlay = f"the lighthouse's nebula exited (its log: {self.grid.logs / 'lighthouse.log'})"
        if not self.no_overlay and lighthouse is not None:
            return (
                f"  overlay:         gangs meet through lighthouse {LIGHTHOUSE_ADDRESS} at udp {lighthouse.endpoint} "
                f"(nebula in a network namespace of its own; log {self.grid.logs / 'lighthouse.log'})"
            )
        return (
            f"  overlay:         OFF: {self.no_overlay}. A gang's replicas cannot reach each other, and a Master "
            "without a lighthouse refuses gangs unless submitted with --network none"
        )

    def renter_lines(self) -> list[str]:
        """What a renter types in another shell: the API and its key in the environment, then workload commands."""
        exports = [f"IDLEGRID_API={self.grid.api_url}", f'IDLEGRID_API_KEY="$(cat {self.grid.root / RENTER_KEY_FILE})"']
        idlegrid = idlegrid_command()
        if idlegrid != "idlegrid" and Path(idlegrid).name == "idlegrid":  # in .venv/bin, not on PATH: put it there
            exports.insert(0, f'PATH="{Path(idlegrid).parent}:$PATH"')
            idlegrid = "idlegrid"
        lines = [
            f"  Rent a GPU as {RENTER}, from another shell (each line pastes as it is; ID is what submit printed):",
            f"    export {' '.join(exports)}",
            f"    search:        {idlegrid} offers search 'num_gpus>=1 price<=2'",
            f"    AMD offers:    {idlegrid} offers search 'vendor=amd'",
            f"    rent:          {idlegrid} rent OFFER --image none --allow-process-runtime -- sleep 300",
            f"    balance:       {idlegrid} balance",
            f"    ledger:        {idlegrid} ledger",
            f"    submit:        {idlegrid} workload submit --name hello --image none --allow-process-runtime"
            " --port 8888 -- sleep 300",
            f"    on AMD:        {idlegrid} workload submit --name on-amd --image none --allow-process-runtime --vendor amd"
            " -- sleep 300",
            *self.gang_lines(idlegrid),
            *self.endpoint_lines(idlegrid),
            f"    list:          {idlegrid} workload list",
            f"    show:          {idlegrid} workload get ID",
            f"    why it waits:  {idlegrid} workload explain ID",
            f"    its output:    {idlegrid} workload logs ID --follow",
            f"    a shell in it: {idlegrid} workload exec ID -- sh",
            f"    reach a port:  {idlegrid} workload port-forward ID 8888   # a port the workload declared with --port",
            f"    cancel:        {idlegrid} workload cancel ID",
            *self.storage_lines(idlegrid),
            "    The demo's simulated hosts run a workload's command as a sandboxed process on the host (image none).",
            *self.template_lines(idlegrid),
        ]
        if self.unsandboxed:
            lines.append(
                f"    NOTE: {len(self.unsandboxed)} of {self.agents} hosts report isolation 'none', so no workload is "
                "placed on them: their agents run commands as an unprivileged user only when the demo runs as root."
            )
        return lines

    def gang_lines(self, idlegrid: str) -> list[str]:
        """Two replicas meeting over their overlay, and replica 1's output, where the demo runs a lighthouse."""
        if self.no_overlay:
            return []
        return [
            f"    gang:          {idlegrid} workload submit --name pair --replicas 2 --image none --allow-process-runtime"
            f" -- {GANG_COMMAND}",
            f"    rank 1 says:   {idlegrid} workload logs ID --replica 1",
        ]

    def storage_lines(self, idlegrid: str) -> list[str]:
        """The demo's object store and a job that checkpoints into it, or why there is none."""
        if self.store is None:
            return [f"    No object store for checkpoints: {self.no_store}."]
        store = self.store.endpoint
        return [
            f"    storage:       printf %s {object_store.KEYS} | {idlegrid} secret create s3"
            f"   # the demo's S3 at {store}, bucket {object_store.BUCKET}, takes any key pair",
            f"    checkpointed:  {idlegrid} workload submit --name steps --image none --allow-process-runtime"
            f" --storage-credentials s3 --storage-endpoint {store} --checkpoint s3://{object_store.BUCKET}/steps/"
            f" --checkpoint-period 10 -- sh -c '{COUNTER}'",
        ]

    def container_host_lines(self) -> list[str]:
        """Where the container host is and what runs on it, or why the demo has none and what to install."""
        if self.podman is None or self.container_host_id is None:
            return [f"  container host:  none: {self.no_container_host}; images and templates need one"]
        images = ", ".join(
            f"{image} ({'built now' if image in self.images_built else 'kept from an earlier run'})"
            for image in (DEMO_IMAGE, SELFTEST.reference)
        )
        return [
            f"  container host:  {CONTAINER_HOST} ({self.container_host_id}): Podman at {self.podman.url}",
            f"    images:        {images}; built here, no registry (its storage: {self.podman.workdir})",
            *(
                f"    NOT OFFERED:   GPU {uuid}, its self-test failed: {detail} (log: {self.grid.logs / CONTAINER_HOST}.log)"
                for uuid, detail in self.unoffered
            ),
        ]

    def template_lines(self, idlegrid: str) -> list[str]:
        """The template that runs on the container host, and what the shipped ones need."""
        registries = "jupyter, comfyui, vllm and cuda-shell pull from docker.io"
        if self.container_host_id is None:
            return [
                f"    templates:     none runs here without a container host ({DEMO_TEMPLATE} needs one, {registries});",
                f"                   {self.no_container_host}",
            ]
        offer = self.container_host_id
        return [
            f"    a template:    {idlegrid} rent {offer} --template {DEMO_TEMPLATE} --wait-link-s 60   # a web page on "
            f"the container host; its link printed once it answers",
            f"    templates:     {idlegrid} template list   # {registries}: they need a host that reaches it, so this "
            "grid refuses them at submit",
        ]

    def console_lines(self) -> list[str]:
        """Where the web console is and how each demo account signs in to it."""
        passwords = self.console_passwords()
        lines = [f"  Console:         {self.grid.api_url}/console/   (sign in with an account and its password)"]
        for account in (RENTER, PROVIDER, OPERATOR):
            lines.append(f"    {account:<15}  password {passwords.get(account, CHANGED)}")
        lines.append(f"    (kept, 0600, in {self.grid.root / CONSOLE_PASSWORDS_FILE})")
        return lines

    def console_passwords(self) -> dict[str, str]:
        path = self.grid.root / CONSOLE_PASSWORDS_FILE
        if not path.exists():
            return {}
        return dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)

    def publish_console_passwords(self) -> None:
        """A console password for the renter, the provider and the operator, made on the first run and kept in
        ``console.passwords`` (0600). They are set again at every start, so a wiped store still accepts them (a
        restart signs the demo accounts' console sessions out)."""
        passwords = self.console_passwords()
        for account in (RENTER, PROVIDER, OPERATOR):
            # The operator's key sets its own account's password: once it has one, the API asks for the current one.
            current = passwords.get(account) if account == OPERATOR else None
            passwords.setdefault(account, secrets.token_urlsafe(12))
            try:
                self.grid.client.set_password(account, passwords[account], current_password=current)
            except ApiError as exc:
                if exc.status != 400:
                    raise
                passwords[account] = CHANGED  # changed in the console since: the demo no longer knows it
        text = "".join(f"{account} {password}\n" for account, password in passwords.items() if password != CHANGED)
        write_atomically(self.grid.root / CONSOLE_PASSWORDS_FILE, text.encode(), mode=0o600)

    def publish_operator_key(self) -> None:
        """The operator key beside the state directory's other files, 0600, where the banner says it is."""
        write_atomically(self.grid.root / OPERATOR_KEY_FILE, self.grid.operator_key_file.read_bytes(), mode=0o600)

    def publish_renter_key(self) -> None:
        """The renter account and an API key of its own in ``renter.token`` (0600). A key already there that still
        acts for the renter is kept, so a restart on the same state directory gives the same key."""
        path = self.grid.root / RENTER_KEY_FILE
        if path.exists() and self._acts_for_renter(path.read_text().strip()):
            return
        self.grid.ensure_account(RENTER, "renter")
        issued = self.grid.client.create_api_key(RENTER, "demo")
        write_atomically(path, f"{issued['key']}\n".encode(), mode=0o600)

    def open_market(self) -> None:
        """Prices on the demo's hosts (their provider's default, unless one is set already) and a first credit for the
        renter, so a renter sees what renting costs and where every cent goes. Both are kept across restarts."""
        listing = self.grid.client.prices(provider=PROVIDER)
        if not any(item["scope"] == "provider" for item in listing["items"]):
            self.grid.client.set_default_price(DEMO_PRICES, provider=PROVIDER)
        self.grid.client.credit(RENTER, RENTER_CREDIT, memo="the demo's welcome credit", key="demo-welcome")

    def publish_endpoint(self) -> None:
        """The renter's serverless endpoint ``echo`` on the process hosts: made the first time, its worker's code (the
        handler library and the echo worker, carried in its spec: carried_worker.py) brought up to date at every start.
        No worker runs until a request comes. Where it cannot be, ``no_endpoint`` says why."""
        if not Path(SYSTEM_PYTHON).exists():
            self.no_endpoint = f"its worker needs the host's Python at {SYSTEM_PYTHON} (Debian package python3)"
            return
        if self.unsandboxed and len(self.unsandboxed) == self.agents:
            self.no_endpoint = "no host here isolates a process (run the demo as root)"
            return
        command, env = carried_worker()
        client = self.grid.client
        found = [e for e in client.endpoints(account=RENTER)["items"] if e["name"] == ENDPOINT_NAME]
        try:
            if found:
                self.endpoint_id = found[0]["id"]
                client.update_endpoint(self.endpoint_id, {"command": command, "env": env})
            else:
                spec = {**ENDPOINT_SPEC, "command": command, "env": env, "account": RENTER}
                self.endpoint_id = client.create_endpoint(spec)["id"]
        except ApiError as exc:  # the grid refuses it (its hosts could never run it): the demo goes on without one
            self.endpoint_id, self.no_endpoint = None, f"the grid refused it: {exc}"

    def endpoint_lines(self, idlegrid: str) -> list[str]:
        """A request to the renter's endpoint, answered once a worker has started for it, or why there is none."""
        if self.endpoint_id is None:
            return [f"    endpoint:      none: {self.no_endpoint}"]
        run = f'{idlegrid} endpoint run {self.endpoint_id} --input \'{{"prompt": "hello from the demo"}}\' --sync'
        return [
            f"    endpoint:      {run}   # serverless: a worker starts for it, and stops {ENDPOINT_IDLE_S} s after",
            f"                   (its requests, workers and cost: {self.grid.api_url}/console/endpoints/{self.endpoint_id})",
        ]

    def _acts_for_renter(self, key: str) -> bool:
        if not key:
            return False
        try:
            me = ApiClient(self.grid.api_url, key).whoami()
        except ApiError as exc:
            if exc.status in (401, 403):  # revoked, or the store was wiped: issue a new one
                return False
            raise
        return bool(me["account"] == RENTER)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _one_line(text: str) -> str:
    """The last line that says something (podman's own reason comes last)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


def idlegrid_command() -> str:
    """How to call ``idlegrid`` from this shell: the name when it is on PATH, else the one beside this Python
    (scripts/demo runs it from .venv/bin without activating the environment)."""
    if shutil.which("idlegrid"):
        return "idlegrid"
    beside = Path(sys.executable).parent / "idlegrid"
    return str(beside) if beside.exists() else f"{sys.executable} -m management.cli"


def _progress(line: str) -> None:
    print(f"idlegrid demo: {line}", flush=True)


def run_demo(state_dir: Path, *, api_port: int | None, agents: int, container_host: bool = True) -> int:
    """Run until SIGINT or SIGTERM; errors (a port in use, a process that does not come up) raise IdlegridError."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    demo: Demo | None = None
    try:
        demo = Demo(state_dir, api_port=api_port, agents=agents, container_host=container_host, say=_progress)
        demo.start()
        demo.publish_operator_key()
        demo.publish_renter_key()
        demo.open_market()
        demo.publish_endpoint()
        demo.publish_console_passwords()
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
            demo.stop()
            print("idlegrid demo: stopped", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
