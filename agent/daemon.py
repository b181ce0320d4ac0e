"""The agent daemon: the I/O shell around this agent's session with the Master (agent/session.py).

It holds the connection (the connector picks the relay and fails over, ``_connect`` dials it and reads it), sends
what the agent has to say (hello, heartbeats, telemetry, results, events) and carries out the action the session
decides for each message from the relay: one ``match`` in ``_carry_out``, one method per action, in the part that
owns it (the executor and its ledger, the tunnel server, the renewer, the relay directory, the benchmark responder).
What a frame means is the session's to decide, never this module's.

The fleet bench (bench/fleet_agents.py) runs thousands of these in one process through the public seams of
``Agent``: the runtime, the ledger, the host, the relay connector, where the relay directory is kept, and a
``LinkObserver`` that sees every frame the agent sends and every action it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Sequence
from typing import Protocol

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.frames import CloseCode

from agent.benchmark.setup import held_by_containers, open_responder
from agent.command_keys import CommandKeys
from agent.config import AgentConfig
from agent.connector import CONNECTION_ERRORS, RelayConnector, RelayTarget
from agent.credentials import CertificateRenewer, describe_expiry, recover_interrupted_renewal
from agent.directory import DirectoryFile, DirectoryStore
from agent.errors import CertificateRevoked, UnansweredCopy, is_revocation
from agent.executor import CommandExecutor
from agent.fault_injection import FAULTS_FILE
from agent.gpus import open_collector
from agent.host import collect_host_info
from agent.host_sample import HostSampler, host_sampler_for
from agent.identity import AgentIdentity
from agent.ledger import CommandLog
from agent.output import KeptOutputRuntime, OutputKeeper
from agent.overlay import GangOverlays
from agent.pci import SYSFS_ROOT
from agent.renewal import RenewalTimer
from agent.runtime import ContainerRuntime, open_runtime
from agent.runtime.base import PullsImages
from agent.runtime.gpu_access import GpuDevices, host_gpu_access
from agent.runtime.images import GB, ImageLimits, PullProgress
from agent.runtime.selftest import SelfTestRetry, gpu_selftest, retest_later
from agent.session import (
    AckCommand,
    Action,
    BadFrame,
    Challenged,
    MasterError,
    MasterSession,
    NewDirectory,
    NewKeys,
    Nothing,
    OpenTunnel,
    RefuseTunnel,
    RelayReported,
    RenewalAnswered,
    ResultAcked,
    RevealAsked,
    RunCommand,
    SendHello,
    Welcomed,
    WorkerAnswered,
)
from agent.simulate import parse_simulate_spec
from agent.ssh_host_keys import HostKeys
from agent.state import private_dir
from agent.storage.plane import DataPlane, StorageSettings
from agent.tunnel import RelayLink, TunnelLimits, TunnelServer
from agent.worker_api import WorkerAPIs
from common.containers import ContainerInfo
from common.errors import IdlegridError, PKIError, RuntimeFailure
from common.inventory import MAX_GPUS_IN_REPORT, MAX_IMAGES_IN_REPORT, GpuReach, HostInfo, ImageSource, Inventory
from common.loopwatch import watching
from common.pki import client_tls_context, load_cert, peer_identity
from common.storage import StorageActivity
from common.wire import (
    HARD_FRAME_BYTES,
    PROTOCOL_VERSIONS,
    AgentEvent,
    AgentEventKind,
    Command,
    CommandAck,
    Heartbeat,
    Hello,
    RelayEntry,
    RelayStatus,
    Telemetry,
    VerifyCommit,
    Welcome,
    WorkerCall,
    encode,
)

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
# On SIGTERM, how long commands already running get to finish and report before the connection closes. Well
# under the 10 s the test harness waits before SIGKILL; what does not finish in time is in the ledger as started,
# and resumes safely (at most once) when the Master resends it.
STOP_GRACE_S = 5.0
# Each report period is drawn from the interval give or take this share of it. Agents that began together (thousands
# reconnecting when a relay restarts, or a host that stalled) would otherwise report in step for good, and every
# period their relay and the Master would take thousands of frames in the same few milliseconds.
REPORT_JITTER = 0.2
STOP_REASON = "agent stopping"  # with close code 1001 (going away): the relay tells the Master at once
PULL_TOLD_KEEP_S = 600.0  # a container's last progress time is forgotten after this long (its pull is long over)
NO_RUNTIME, NO_ISOLATION = "", "none"  # what hello reports while the runtime cannot run containers
ENDED_STATES = frozenset({"exited", "dead"})  # a container in one of these ended (on its own: delete removes it)


class LinkObserver(Protocol):
    """Sees the control link's traffic: the fleet bench counts frames and times commands with it. Called on the
    agent's event loop, on its hot path: it must not block."""

    def message_received(self, action: Action) -> None:
        """A message came from the relay and the session decided ``action`` (called before it is carried out)."""

    def frame_sent(self, frame: msgspec.Struct) -> None:
        """``frame`` went out on the link (a resend each time)."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        runtime: ContainerRuntime | None = None,
        ledger: CommandLog | None = None,
        host: HostInfo | None = None,
        connector: RelayConnector | None = None,
        directory: DirectoryStore | None = None,
        observer: LinkObserver | None = None,
    ) -> None:
        """``runtime``, ``ledger``, ``host``, ``connector`` and ``directory`` (where the Master's relay directory is
        kept) default to what ``config`` names; the fleet simulator passes its own, so thousands of agents in one
        process share one host description, dial from their own addresses and keep no file each. ``observer`` sees
        the link's traffic (``LinkObserver``)."""
        self.config = config
        if config.simulate:
            parse_simulate_spec(config.simulate)  # a typo is a one-line error now, before anything else is read
        private_dir(config.state_path)  # also a state directory an older agent made with the umask's mode
        if recover_interrupted_renewal(config.state_path):
            log.info("finished a certificate renewal interrupted by a restart")
        self.identity = AgentIdentity.load(config.state_path)
        self.session = MasterSession()  # what each frame from the Master means (agent/session.py)
        self._observer = observer
        self._directory = directory if directory is not None else DirectoryFile(config.state_path)
        self.relay_directory: list[RelayEntry] = self._directory.load()
        self._directory_saved: asyncio.Task[None] | None = None
        self.connector = connector or RelayConnector.from_config(
            config, static_urls=config.access_urls or self.identity.access_urls, directory=self.relay_directory
        )
        self.collector = open_collector(
            config.simulate or None,
            host_key=str(config.state_path.resolve()),
            faults_file=config.state_path / FAULTS_FILE,
        )
        ca_cert = load_cert(self.identity.ca_file.read_bytes())
        renewer = CertificateRenewer(config.state_path, self.identity.agent_id, ca_cert, fraction=config.cert_renew_fraction)
        if (expired := describe_expiry(renewer)) is not None:
            log.error(expired)
        self.renewal = RenewalTimer(renewer)  # agent/renewal.py
        self.command_keys = CommandKeys(self.identity, ca_cert)  # the keys commands and tickets are checked with
        self.verifier = self.command_keys.verifier
        self.ledger = ledger if ledger is not None else CommandLog(config.state_path / "commands.db")
        # Which vendor made each GPU and, for an AMD card, the device files a container is given (its render node),
        # read from sysfs; refreshed at each self-test (agent/runtime/gpu_access.py).
        self.gpu_devices = GpuDevices(host_gpu_access(self.collector.inventory(), SYSFS_ROOT))
        if runtime is None:
            runtime = open_runtime(config.runtime, **_runtime_options(config, self.gpu_devices))
        self.runtime = runtime
        self.runtime_problem: str | None = None  # why the runtime cannot run containers, as last probed
        self.gpu_reach: list[GpuReach] = []  # the GPU self-test's result since the runtime was last found ready
        self._gpus_tested_with: ContainerRuntime | None = None  # the runtime the self-test ran with, while it stays ready
        self._retesting: asyncio.Task[None] | None = None  # GPUs whose self-test failed for a passing reason, tested again
        self.output = OutputKeeper(
            config.state_path / "output",
            limit=config.output_keep_bytes,
            retention_s=config.output_keep_s,
            budget_bytes=config.output_keep_total_bytes,
        )
        # Gangs' private networks (docs/overlay.md): where this host can run nebula, its key goes to the Master in hello.
        self.overlays = GangOverlays.available(config.state_path)
        self.host_keys = HostKeys.at(config.state_path)  # the workloads' SSH host keys (docs/ssh.md)
        # Workloads' object storage (agent/storage/): its transfers are reported to the Master as events.
        self.data: DataPlane | None = None
        if config.storage:
            self.data = DataPlane(
                StorageSettings(
                    root=str(config.storage_path),
                    cache_budget_bytes=int(config.storage_cache_gb * 1024**3),
                    bytes_per_s=int(config.storage_bandwidth_mbps * 1e6 / 8),
                    transfer_slots=config.storage_transfer_slots,
                    final_upload_s=config.storage_final_upload_s,
                    egress=config.egress_rule(),
                ),
                self._on_storage,
            )
        # Endpoint workers' own worker API, each on a unix socket in its container's files (agent/worker_api.py).
        self.worker_apis = WorkerAPIs(config.state_path / "worker-api", self._send_worker_call)
        self.executor = CommandExecutor(
            self.identity.agent_id,
            self.ledger,
            self.runtime,
            self.verifier,
            host_gpus=self.collector.inventory,
            on_pull_progress=self._on_pull_progress,
            keeper=self.output,
            overlays=self.overlays,
            host_keys=self.host_keys,
            data=self.data,
            private_paths=config.private_paths(),
            worker_apis=self.worker_apis,
        )
        # Verification challenges (agent/benchmark/): answered with the benchmark this host can run, if any.
        self.verification, self.benchmark = open_responder(
            self.collector.inventory(),
            simulated=self.collector.simulated,
            cheat=config.simulate_bench,
            held_gpus=held_by_containers(self.runtime),
        )
        self._held_gpus = held_by_containers(self.runtime)  # what a simulated card's load follows
        self.images: list[str] = []  # the images the host has, warm first, bounded: hello's, as last listed
        self._pull_told: dict[str, float] = {}  # container -> when its pull progress was last sent
        self._pull_sends: set[asyncio.Task[None]] = set()
        self.tunnels = TunnelServer(
            self.identity.agent_id,
            self.verifier,
            KeptOutputRuntime(self.runtime, self.output),  # logs of a deleted container: what was kept of it
            TunnelLimits(
                max_tunnels=config.max_tunnels,
                max_streams=config.max_tunnel_streams,
                dial_timeout_s=config.tunnel_dial_timeout_s,
                max_per_account=config.max_tunnels_per_account,
                max_per_workload=config.max_tunnels_per_workload,
                idle_timeout_s=config.tunnel_idle_timeout_s,
            ),
            host_keys=self.host_keys,
        )
        self._relay_link: RelayLink | None = None  # the relay the control link is on now: where tunnels are dialled
        self.host: HostInfo = host if host is not None else collect_host_info(config.state_path)
        # The host's own telemetry, for an agent describing its own host (the fleet simulator passes ``host``: its
        # thousands of agents in one process share one machine, which none of them should report as its own).
        self.host_sampler: HostSampler | None = host_sampler_for(config.state_path) if host is None else None
        self.reports_skipped = 0  # heartbeats and telemetry not sent because the link was backed up (_send_report)
        self.connected = asyncio.Event()  # the Master welcomed the current connection
        self.relay_url = ""
        self._ws: ClientConnection | None = None
        self._running: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()  # set with the session's stop: wakes the connector
        self._stop_deadline = 0.0  # loop time by which running commands must have finished, once stopping
        self._closer: asyncio.Future[None] | None = None
        self._tls: tuple[tuple[int, int], ssl.SSLContext] | None = None  # (file stamps, context) of the last connection
        self._exits_told: dict[str, int] = {}  # exits sent as events by this process (name -> code), not resent
        # Set while a container may be running: the exit check looks only then, and otherwise costs nothing (the
        # fleet simulator runs thousands of agents in one process, most with no container).
        self._watch_exits = asyncio.Event()
        self._watch_exits.set()

    # --- connection ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until stopped; raises CertificateRevoked when a relay says this agent's certificate is revoked."""
        await self.probe_runtime()
        if self.overlays is not None:
            await self.overlays.resume(self.runtime)  # gang replicas still running get their overlay again
        await self._resume_storage()
        await self._resume_worker_apis()
        background = [asyncio.create_task(self._runtime_probe_loop())]
        if self.config.measure_bandwidth:
            background.append(asyncio.create_task(self._bandwidth_loop()))
        try:
            await self.connector.run(self._session, self._stopping)  # which relay, when: agent/connector.py
        finally:
            for task in background:
                task.cancel()
            await self.close()

    def stop(self) -> None:
        """Graceful stop (SIGTERM): take no new command, let running ones finish and send their results
        (up to STOP_GRACE_S), then close the connection."""
        if self.session.stopping:
            return
        self.session.stop()
        self._stopping.set()
        self._stop_deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        self._closer = asyncio.ensure_future(self._disconnect_when_settled())

    async def _disconnect_when_settled(self) -> None:
        await self._commands_settled()
        if self._ws is not None:
            # The results sent before this go out ahead of the close frame; 1001 says the agent is going away.
            await self._ws.close(CloseCode.GOING_AWAY, STOP_REASON)

    async def _commands_settled(self) -> None:
        """Wait, until the stop deadline, for the commands running now; each has its result in the ledger when done."""
        running = [task for task in self._running if not task.done()]
        if not running:
            return
        log.info("stopping: waiting for running commands", extra={"commands": sorted(self.session.running)})
        await asyncio.wait(running, timeout=max(0.0, self._stop_deadline - asyncio.get_running_loop().time()))

    async def close(self) -> None:
        if self.session.stopping:
            await self._commands_settled()  # also when no connection was open to wait on
        for task in list(self._running):
            task.cancel()
        if self._retesting is not None:
            self._retesting.cancel()
        await self.tunnels.close()
        if self.overlays is not None:
            await self.overlays.close()  # resumed at the next start for the replicas that still run
        if self.data is not None:
            await self.data.close()
        await self.worker_apis.close_all()  # served again by the next start for the workers that still run
        if self._directory_saved is not None:
            await self._directory_saved  # the directory the Master sent last is on disk for the next start
        await self.runtime.close()
        self.collector.close()
        self.ledger.close()

    async def _session(self, relay: RelayTarget) -> bool:
        """One connection to ``relay``, served until it ends; whether the Master welcomed us on it. Errors before
        the welcome propagate (the attempt failed); after it, the loss of the link is the session's normal end."""
        try:
            await self._connect(relay)
        except ConnectionClosed as exc:
            if is_revocation(exc.rcvd):
                log.error("the relay says this agent's certificate is revoked; stopping", extra={"relay": str(relay)})
                raise CertificateRevoked() from None
            if not self.connected.is_set():
                raise
            log.warning("relay connection lost", extra={"relay": str(relay), "error": str(exc) or type(exc).__name__})
        except CONNECTION_ERRORS as exc:
            if not self.connected.is_set():
                raise
            log.warning("relay connection lost", extra={"relay": str(relay), "error": str(exc) or type(exc).__name__})
        finally:
            welcomed = self.connected.is_set()
            self.connected.clear()
        return welcomed

    def tls_context(self) -> ssl.SSLContext:
        """Built again only when the certificate or key files change (a renewal): loading them costs more CPU than
        the handshake itself, which matters when thousands of agents share a process (bench/fleet_agents.py)."""
        stamp = (self.identity.cert_file.stat().st_mtime_ns, self.identity.key_file.stat().st_mtime_ns)
        if self._tls is None or self._tls[0] != stamp:
            context = client_tls_context(self.identity.ca_file, self.identity.cert_file, self.identity.key_file)
            self._tls = (stamp, context)
        return self._tls[1]

    async def _connect(self, relay: RelayTarget) -> None:
        ssl_context = self.tls_context()
        config = self.config
        dial = self.connector.dial(
            relay,
            ssl=ssl_context,
            max_size=HARD_FRAME_BYTES,
            open_timeout=10,
            compression=None,
            ping_interval=config.ping_interval_s,
            ping_timeout=config.ping_timeout_s,
        )
        async with dial as ws:
            give_up_unacknowledged(ws, config.relay_ack_timeout_s)
            self._ws, self.relay_url = ws, relay.url
            self._relay_link = relay_link(ws, relay, ssl_context)
            self.session.connection_opened()
            log.info("connected to relay", extra={"relay": str(relay), "region": relay.region})
            await self._send(self._hello())
            tasks = [
                asyncio.create_task(self._heartbeat_loop(ws)),
                asyncio.create_task(self._telemetry_loop(ws)),
                asyncio.create_task(self._resend_loop(ws)),
            ]
            if config.exit_check_s > 0:
                tasks.append(asyncio.create_task(self._exit_check_loop(ws)))
            try:
                while True:
                    try:
                        message = await ws.recv(decode=False)  # msgspec reads UTF-8 itself: no str made first
                    except ConnectionClosedOK:
                        break
                    await self._on_message(message)
            finally:
                self._ws, self._relay_link = None, None
                for task in tasks:
                    task.cancel()

    @property
    def connection(self) -> ClientConnection | None:
        """The relay connection open now; None between connections."""
        return self._ws

    async def _send(self, frame: msgspec.Struct) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        await ws.send(encode(frame), text=True)
        if self._observer is not None:
            self._observer.frame_sent(frame)

    async def _send_report(self, frame: Heartbeat | Telemetry) -> bool:
        """Send a heartbeat or telemetry report unless the link is backed up; whether it went.

        Telemetry's lane on the agent: control frames (acks, results, hellos, events) always go, while a report that
        finds ``report_backlog_bytes`` still unsent is skipped and counted (``reports_skipped``): the next one says
        the same, newer, so what waits on a slow link is control, never a pile of reports ahead of it."""
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        transport = ws.transport
        if transport is not None and transport.get_write_buffer_size() > self.config.report_backlog_bytes:
            self.reports_skipped += 1
            return False
        await self._send(frame)
        return True

    def _hello(self) -> Hello:
        ready = self.runtime_problem is None
        inventory = Inventory(
            host=self.host,
            gpus=self.collector.inventory(),
            simulated=self.collector.simulated,
            runtime=self.runtime.name if ready else NO_RUNTIME,
            isolation=self.runtime.isolation if ready else NO_ISOLATION,
            gpu_reach=self.gpu_reach if ready else [],
            images=self.images if ready else [],
            overlay_key=self.overlays.key.public_pem if self.overlays is not None else "",
            image_source=self._image_source() if ready else None,
            unoffered=self.collector.unoffered()[:MAX_GPUS_IN_REPORT],
        )
        return Hello(
            versions=list(PROTOCOL_VERSIONS),
            agent_version=AGENT_VERSION,
            inventory=inventory,
            region=self.config.region,
            command_keys=sorted(self.verifier.keys()),
            benchmark=self.benchmark,
            challenge_forms=list(self.verification.forms),
        )

    def _image_source(self) -> ImageSource | None:
        """Where this host gets images, for a runtime that pulls them: the Master refuses at submit what no host of
        its grid can get (this one has pulls off, or names only other registries)."""
        if not isinstance(self.runtime, PullsImages):
            return None
        c = self.config
        return ImageSource.of_settings(c.image_pull, c.image_registries_allowed, c.image_registries_denied)

    # --- frames from the master ----------------------------------------------------------------

    async def _on_message(self, message: str | bytes) -> None:
        action = self.session.receive(message)
        if self._observer is not None:
            self._observer.message_received(action)
        await self._carry_out(action)

    async def _carry_out(self, action: Action) -> None:
        """Do what the session decided (agent/session.py lists each action and why), in the part that owns it."""
        match action:
            case Nothing():
                pass
            case RunCommand(command):
                self._spawn(self._run_command(command))
            case AckCommand(command_id):
                self._spawn(self._send(CommandAck(id=command_id)))  # a resend of one running here: its result follows
            case ResultAcked(command_id):
                self.ledger.mark_acked(command_id)
            case Welcomed(welcome):
                self._on_welcome(welcome)
            case NewKeys(keys, endorsements, retired):
                self.command_keys.update(keys, endorsements, retired)
            case OpenTunnel(frame):
                self.tunnels.open(frame.ticket, self._relay_link)  # checks it, then serves it in a task of its own
            case RefuseTunnel(ticket_id):
                log.info("tunnel refused: agent stopping", extra={"ticket": ticket_id})
            case RelayReported(status, degraded, hello_again):
                self._on_relay_status(status, degraded)
                if hello_again:
                    await self._send(self._hello())
            case NewDirectory(relays):
                self._on_relay_directory(relays)
            case RenewalAnswered(response):
                self.renewal.answered(response)
            case Challenged(challenge):  # verification (agent/benchmark/)
                self._spawn(self._answer(self.verification.on_challenge(challenge)))
            case WorkerAnswered(answer):
                self.worker_apis.on_answer(answer)
            case RevealAsked(reveal):
                if (opened := self.verification.on_reveal(reveal)) is not None:
                    await self._send_quietly(opened)
            case SendHello():
                await self._send(self._hello())
            case MasterError(code, message):
                log.warning("relay or master reported an error", extra={"code": code, "detail": message})
            case BadFrame(error):
                log.warning("bad frame from relay: %s", error)

    def _on_welcome(self, welcome: Welcome) -> None:
        self.command_keys.update(welcome.command_keys, welcome.key_endorsements, welcome.retired_keys)
        if welcome.relays:  # a Master older than the directory sends none: keep the one we have
            self._on_relay_directory(welcome.relays)
        self.connected.set()
        if self._ws is not None:
            self.renewal.start(self._ws)  # renews on a connection the Master answers on
        log.info("welcomed by the master", extra={"agent_id": welcome.agent_id, "protocol": welcome.version})

    def _on_relay_status(self, status: RelayStatus, degraded: bool) -> None:
        """The relay says whether the Master is reachable through it. While it is not, frames wait in the relay's
        buffer (results included, never dropped) and the Master's silence is no fault of this connection."""
        if degraded:
            log.warning(
                "relay reports the master unreachable; frames wait in its buffer",
                extra={"relay": self.relay_url, "master_link": status.master_link, "buffered": status.buffered},
            )
        else:
            log.info("relay reports the master reachable again", extra={"relay": self.relay_url, "buffered": status.buffered})

    def _on_relay_directory(self, relays: list[RelayEntry]) -> None:
        """Keep the Master's latest relay directory, on disk too, so a restarted agent can fail over along it."""
        if not self.connector.update_directory(relays):
            return
        self.relay_directory = list(relays)
        # The latest save waits for the ones before it (DirectoryFile): close() awaits it.
        self._directory_saved = asyncio.create_task(self._directory.save(self.relay_directory))
        log.info("relay directory updated", extra={"relays": [f"{r.relay_id}@{r.region}" for r in relays]})

    # --- the runtime -----------------------------------------------------------------------------

    async def probe_runtime(self) -> bool:
        """Ask the runtime whether it can run containers; log when that changes. Whether it changed."""
        try:
            await asyncio.wait_for(self.runtime.probe(), self.config.runtime_probe_timeout_s)
            problem = None
        except RuntimeFailure as exc:
            problem = str(exc)
        except TimeoutError:  # a hung engine must not keep the agent from its relay
            problem = f"the {self.runtime.name} runtime did not answer within {self.config.runtime_probe_timeout_s:g} s"
        if problem is None and self._gpus_tested_with is not self.runtime:
            # Once per runtime that became ready (at start too, when the problem stays None): before a hello offers it.
            log.info("container runtime ready", extra={"runtime": self.runtime.name, "isolation": self.runtime.isolation})
            self._gpus_tested_with = self.runtime
            await self.selftest_gpus()
        images_changed = await self._list_images() if problem is None else False
        if problem == self.runtime_problem:
            return images_changed
        self.runtime_problem = problem
        if problem is not None:
            self._gpus_tested_with = None  # when it is back, its GPUs are tested again
            log.error(
                "no container runtime: this host offers nothing to run until it is fixed: %s",
                problem,
                extra={"runtime": self.runtime.name},
            )
        return True

    async def selftest_gpus(self) -> None:
        """Prove each GPU reaches a container of the runtime before the host is offered (agent/runtime/selftest.py);
        a GPU that does not is logged with the fix, and the Master offers it to no one until it passes: one that failed
        for a reason that passes (the engine's, agent/runtime/selftest.py) is tested again later (``_retest_gpus``)."""
        if self._retesting is not None:
            self._retesting.cancel()  # this test covers every GPU
            self._retesting = None
        gpus = self.collector.inventory()
        self.gpu_devices.know(host_gpu_access(gpus, SYSFS_ROOT))
        runtime = self.runtime
        self.gpu_reach = await gpu_selftest(runtime, gpus)
        self._log_reach(self.gpu_reach)
        if self.config.gpu_selftest_retests and any(retest_later(reach) for reach in self.gpu_reach):
            self._retesting = asyncio.create_task(self._retest_gpus(runtime))

    async def _retest_gpus(self, runtime: ContainerRuntime) -> None:
        """The GPUs whose self-test failed for a reason that passes, tested again ``gpu_selftest_retest_s`` later, then
        twice as long each time, ``gpu_selftest_retests`` times at most; a new hello offers those that pass. Ends when
        the runtime is no longer the one tested (it is tested whole when it is ready again)."""
        for retest in range(self.config.gpu_selftest_retests):
            await asyncio.sleep(self.config.gpu_selftest_retest_s * 2**retest)
            again = {reach.uuid for reach in self.gpu_reach if retest_later(reach)}
            if self._gpus_tested_with is not runtime or self.runtime_problem is not None or not again:
                return
            log.info("GPU self-test run again after a passing failure", extra={"gpus": sorted(again)})
            tested = await gpu_selftest(runtime, [gpu for gpu in self.collector.inventory() if gpu.uuid in again])
            if self._gpus_tested_with is not runtime:
                return
            by_uuid = {reach.uuid: reach for reach in tested}
            self.gpu_reach = [by_uuid.get(reach.uuid, reach) for reach in self.gpu_reach]
            self._log_reach(tested)
            if self._ws is not None:  # what the Master offers, or why not, may have changed
                with contextlib.suppress(ConnectionError, ConnectionClosed):
                    await self._send(self._hello())

    def _log_reach(self, tested: Sequence[GpuReach]) -> None:
        for reach in tested:
            if reach.reachable:
                log.info("GPU self-test passed", extra={"gpu": reach.uuid, "detail": reach.detail})
            else:
                log.error(
                    "GPU self-test failed: this GPU is not offered until it is fixed: %s; fix: %s",
                    reach.detail,
                    reach.fix,
                    extra={"gpu": reach.uuid, "runtime": self.runtime.name},
                )

    async def _list_images(self) -> bool:
        """Refresh the images hello reports (a runtime that pulls lists them); whether the list changed."""
        if not isinstance(self.runtime, PullsImages):
            return False
        try:  # bounded like the probe: a hung engine must not keep the agent from its relay
            images = await asyncio.wait_for(
                self.runtime.image_references(MAX_IMAGES_IN_REPORT), self.config.runtime_probe_timeout_s
            )
        except (RuntimeFailure, TimeoutError) as exc:
            log.warning("could not list the host's images: %s", exc or "the engine did not answer in time")
            return False
        changed, self.images = images != self.images, images
        return changed

    def _on_pull_progress(self, container: str, progress: PullProgress) -> None:
        """Tell the Master how a create's pull goes, at most every ``image_progress_s`` per container (the renter sees
        it as the workload's detail); sent on a task of its own, so the pull never waits on the link."""
        now = time.monotonic()
        if now - self._pull_told.get(container, -math.inf) < self.config.image_progress_s:
            return
        self._pull_told = {name: at for name, at in self._pull_told.items() if now - at < PULL_TOLD_KEEP_S}
        self._pull_told[container] = now
        event = AgentEvent(
            kind=AgentEventKind.IMAGE_PULL, ts=time.time(), container=container, message=f"pulling image: {progress.text()}"
        )
        task = asyncio.get_running_loop().create_task(self._send_quietly(event))
        self._pull_sends.add(task)
        task.add_done_callback(self._pull_sends.discard)

    def _on_storage(self, container: str, activity: StorageActivity) -> None:
        """A transfer for a workload, to the Master (the workload's events and its checkpoint's time and size)."""
        event = AgentEvent(kind=AgentEventKind.STORAGE, ts=time.time(), container=container, storage=activity)
        task = asyncio.get_running_loop().create_task(self._send_quietly(event))
        self._pull_sends.add(task)
        task.add_done_callback(self._pull_sends.discard)

    async def _resume_storage(self) -> None:
        """Containers that outlived a previous agent process go on syncing their checkpoints and outputs."""
        if self.data is None:
            return
        try:
            present = {c.name for c in await self.runtime.list()}
        except IdlegridError as exc:
            log.warning("storage of running containers not resumed: %s", exc)
            return
        resumed = self.data.resume(present)
        if resumed:
            log.info("storage sync resumed", extra={"containers": resumed})

    async def _send_worker_call(self, call: WorkerCall) -> bool:
        """An endpoint worker's call to the Master; False when there is no link to carry it now (the worker retries)."""
        if self._ws is None:
            return False
        try:
            await self._send(call)
        except (ConnectionError, ConnectionClosed):
            return False
        return True

    async def _resume_worker_apis(self) -> None:
        """Endpoint workers that outlived a previous agent process get their worker API again."""
        try:
            running = {c.name for c in await self.runtime.list() if c.state not in ENDED_STATES}
        except RuntimeFailure as exc:
            log.warning("endpoint workers not resumed: the runtime did not answer", extra={"error": str(exc)})
            return
        await self.worker_apis.resume(running)

    async def _send_quietly(self, frame: msgspec.Struct) -> None:
        with contextlib.suppress(ConnectionError, ConnectionClosed):
            await self._send(frame)

    async def _runtime_probe_loop(self) -> None:
        """An engine started (or stopped) after the agent: a new hello tells the Master what the host offers now."""
        while True:
            await asyncio.sleep(self.config.runtime_probe_s)
            if await self.probe_runtime() and self._ws is not None:
                with contextlib.suppress(ConnectionError, ConnectionClosed):
                    await self._send(self._hello())

    async def _run_command(self, command: Command) -> None:
        """Ack the command, run it (the session handed its id to no other run) and send its result."""
        command_id = command.body.id
        acked = False  # an ack that did not go (the link is down): not run, the Master resends it
        try:
            await self._send(CommandAck(id=command_id))
            acked = True
            result = await self.executor.execute(command)
        except UnansweredCopy:
            return  # logged by the executor: the intact copy the Master sends again resumes the run and answers it
        finally:
            self.session.command_ended(command_id)
            if acked:
                self._watch_exits.set()  # a container may have started
        with contextlib.suppress(ConnectionError, ConnectionClosed):
            await self._send(result)  # if the link is down, the resend loop delivers it later
        if command.body.kind == "create_container" and result.ok and await self._list_images():
            # A pulled image makes this host warm for it: the offers say so now, not at the next probe.
            with contextlib.suppress(ConnectionError, ConnectionClosed):
                await self._send(self._hello())

    async def _answer(self, commit: Awaitable[VerifyCommit]) -> None:
        await self._send_quietly(await commit)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    # --- periodic reports ----------------------------------------------------------------------

    async def _heartbeat_loop(self, ws: ClientConnection) -> None:
        await self.connected.wait()  # the welcome sets the interval
        while True:
            containers = await self.runtime.list()
            running = sorted(c.name for c in containers if c.state == "running")
            exited = await self._report_exits(containers)
            overlay = self.overlays.paths() if self.overlays is not None else {}
            await self._send_report(self.session.heartbeat(time.time(), running, exited, overlay))
            await asyncio.sleep(jittered(self.session.heartbeat_s))

    async def _exit_check_loop(self, ws: ClientConnection) -> None:
        """While a container runs, look for one that ended every ``exit_check_s``, so its exit is reported at once
        rather than with the next heartbeat."""
        await self.connected.wait()
        while True:
            await self._watch_exits.wait()
            await asyncio.sleep(self.config.exit_check_s)
            try:
                await self._report_exits(await self.runtime.list())
            except RuntimeFailure as exc:
                log.debug("exit check skipped: %s", exc)

    async def _report_exits(self, containers: list[ContainerInfo]) -> dict[str, int]:
        """Every container that ended and is not deleted (name -> exit status), for the heartbeat; each one not told
        yet is sent as a ``container_exited`` event first. An exit told while the link was down is told again by
        every heartbeat, which carries them all."""
        exited = {c.name: c.exit_code for c in containers if c.state in ENDED_STATES and c.exit_code is not None}
        if any(c.state == "running" for c in containers):
            self._watch_exits.set()
        else:
            self._watch_exits.clear()
        for name in exited.keys() & self.worker_apis.served():
            await self.worker_apis.close(name)  # an endpoint worker's container ended: its requests go back
        await self.worker_apis.lost({c.name for c in containers})  # or is no longer there at all
        for name, code in exited.items():
            if self._exits_told.get(name) == code:
                continue
            log.info("container ended on its own", extra={"container": name, "exit_code": code})
            event = AgentEvent(kind=AgentEventKind.CONTAINER_EXITED, ts=time.time(), container=name, code=code)
            with contextlib.suppress(ConnectionError, ConnectionClosed):
                await self._send(event)
                self._exits_told[name] = code
        if self._exits_told.keys() - exited.keys():
            self._exits_told = {name: code for name, code in self._exits_told.items() if name in exited}
        return exited

    async def _telemetry_loop(self, ws: ClientConnection) -> None:
        await self.connected.wait()
        while True:
            await asyncio.sleep(jittered(self.session.telemetry_s))
            # NVML calls may block, so they run in a thread; simulated GPUs answer at once (and thousands of
            # simulated agents in one process would spend more on the thread hand-off than on the samples).
            if self.collector.simulated:  # busy while a running container holds it, idle otherwise
                with contextlib.suppress(RuntimeFailure):  # the engine did not answer: the cards keep their last state
                    self.collector.hold(await self._held_gpus())
            samples = self.collector.sample() if self.collector.simulated else await asyncio.to_thread(self.collector.sample)
            host = self.host_sampler.sample(time.time()) if self.host_sampler is not None else None
            if samples or host is not None:
                await self._send_report(Telemetry(ts=time.time(), samples=samples, host=host))
            reports = self.collector.reports() if self.collector.simulated else await asyncio.to_thread(self.collector.reports)
            for report in reports:  # Xid and ECC errors: the Master decides which make a GPU faulty
                await self._send(report)

    async def _resend_loop(self, ws: ClientConnection) -> None:
        """Results stay in the ledger until the Master acknowledges them."""
        while True:
            for result in self.executor.pending_results():
                await self._send(result)
            await asyncio.sleep(self.config.result_resend_s)

    async def _bandwidth_loop(self) -> None:
        from agent.bandwidth import measure_bandwidth

        base = self.identity.http_url
        if not base:
            return
        while True:
            try:
                figures = await measure_bandwidth(base, ca_file=self.identity.ca_file)
                self.host = msgspec.structs.replace(
                    self.host,
                    bandwidth_mbps_down=figures.download_mbps,
                    bandwidth_mbps_up=figures.upload_mbps,
                    latency_ms=figures.latency_ms,
                )
                if self._ws is not None:
                    await self._send(self._hello())  # a hello refreshes the inventory the Master holds
            except (IdlegridError, ConnectionError, ConnectionClosed) as exc:
                log.warning("bandwidth measurement failed: %s", exc)
            await asyncio.sleep(self.config.bandwidth_interval_s)


def _runtime_options(config: AgentConfig, gpu_table: GpuDevices) -> dict[str, object]:
    if config.runtime == "process":
        work = config.process_work_dir or None
        return {
            "state_dir": config.state_path,
            "user": config.process_user,
            "work_root": work,
            "uids": config.process_uids,
            "network": config.process_network,
            "simulated_gpus": bool(config.simulate),
            "selftest_timeout_s": config.gpu_selftest_timeout_s,
            "selftest_retry": SelfTestRetry(tries=config.gpu_selftest_tries),
            "gpu_table": gpu_table,
        }
    if config.runtime == "docker":
        return {
            "socket": config.docker_socket,
            "simulated_gpus": bool(config.simulate),
            "gpu_devices": config.docker_gpu_devices,
            "network": config.docker_network,
            "selftest_image": config.gpu_selftest_image,
            "selftest_timeout_s": config.gpu_selftest_timeout_s,
            "selftest_retry": SelfTestRetry(tries=config.gpu_selftest_tries),
            "images": image_limits(config),
            "image_state": config.state_path / "images.json",
            "gpu_table": gpu_table,
        }
    return {}  # open_runtime names the runtimes it knows


async def serve(config: AgentConfig) -> None:
    agent = Agent(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    async with watching("agent"):
        await agent.run()


def jittered(period_s: float, spread: float = REPORT_JITTER) -> float:
    """``period_s`` give or take ``spread`` of it, drawn afresh each time: the mean stays ``period_s``."""
    return period_s * (1.0 + spread * (2.0 * random.random() - 1.0))


def relay_link(ws: ClientConnection, relay: RelayTarget, ssl_context: ssl.SSLContext) -> RelayLink | None:
    """Where this connection's tunnels are dialled: the relay's identity is the one its certificate names (the
    Master names relays by it, in tickets too); None when it names none, and then no tunnel is served."""
    try:
        relay_id = peer_identity(ws.transport.get_extra_info("ssl_object") if ws.transport is not None else None).id
    except PKIError as exc:
        log.warning("the relay's certificate names no identity; tunnels are refused on this link: %s", exc)
        return None
    return RelayLink(relay_id=relay_id, url=relay.url, ssl=ssl_context, address=relay.address)


def give_up_unacknowledged(ws: ClientConnection, timeout_s: float) -> bool:
    """Have the kernel end the connection when what was sent stays unacknowledged for ``timeout_s``
    (TCP_USER_TIMEOUT, Linux); whether it could."""
    sock = ws.transport.get_extra_info("socket") if ws.transport is not None else None
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is None or option is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(timeout_s * 1000))
    except OSError as exc:
        log.info("could not set TCP_USER_TIMEOUT on the relay connection: %s", exc)
        return False
    return True


def image_limits(config: AgentConfig) -> ImageLimits:
    """The docker runtime's image settings from the agent's (docs/images.md)."""
    return ImageLimits(
        pull=config.image_pull,
        registries_allowed=tuple(config.image_registries_allowed),
        registries_denied=tuple(config.image_registries_denied),
        max_image_bytes=round(config.image_max_gb * GB),
        pull_timeout_s=config.image_pull_timeout_s,
        disk_budget_bytes=round(config.image_disk_budget_gb * GB),
        egress=config.egress_rule(),
    )
