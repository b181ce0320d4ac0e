"""Runs the Master's container commands: verified, at most once, each result kept until acknowledged.

A refused copy (its signature does not verify) ends its command id here as refused, kept and answered like any
result: the Master ends the command on that refusal, so a later copy of the id, even intact, must not run.

Before it starts a container with GPUs, the agent checks again what the Master already enforces (one holder per
GPU or MIG instance, and a whole GPU and its instances exclude each other): every GPU named must be on this host,
and none held by another running container of this agent. The GPUs a
container holds travel on it as a label (``LABEL_GPUS``, UUIDs), so the check also sees containers a previous agent
process started. Checks and creates run one at a time, so two commands cannot both take the same GPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from agent.errors import GpuConflict, UnansweredCopy, UnknownGpu
from agent.ledger import REFUSED_PREFIX, CommandLog, CommandLogEntry
from agent.output import OutputKeeper
from agent.overlay import GangOverlays
from agent.redact import redact, secrets_of
from agent.runtime.base import ContainerRuntime, Mount, MountsData, PullsImages
from agent.runtime.images import PullProgress
from agent.ssh_host_keys import HostKeys
from agent.storage.plane import DataPlane
from agent.worker_api import WorkerAPIs
from common.containers import (
    LABEL_AGENT_ID,
    LABEL_COMMAND_ID,
    LABEL_PORTS,
    LABEL_RENTAL_ID,
    LABEL_REPLICA,
    LABEL_WORKLOAD_ID,
    ContainerInfo,
    ContainerSpec,
    parse_create_spec,
    parse_delete_spec,
)
from common.errors import IdlegridError, RuntimeFailure, SignatureError
from common.inventory import GpuInfo
from common.pki import CommandVerifier
from common.wire import Command, CommandResult, signing_bytes

log = logging.getLogger(__name__)

LABEL_GPUS = "io.idlegrid.gpus"  # the UUIDs of the GPUs a container holds, comma-separated
RUNNING = "running"


def _no_gpus() -> Sequence[GpuInfo]:
    return ()


class CommandExecutor:
    def __init__(
        self,
        agent_id: str,
        ledger: CommandLog,
        runtime: ContainerRuntime,
        verifier: CommandVerifier,
        *,
        host_gpus: Callable[[], Sequence[GpuInfo]] = _no_gpus,
        on_pull_progress: Callable[[str, PullProgress], None] | None = None,
        keeper: OutputKeeper | None = None,
        overlays: GangOverlays | None = None,
        host_keys: HostKeys | None = None,
        data: DataPlane | None = None,
        private_paths: Mapping[str, str] | None = None,
        worker_apis: WorkerAPIs | None = None,
    ) -> None:
        """``host_gpus``: this host's GPUs now (the collector's inventory). ``on_pull_progress(container, progress)``:
        a create's image pull moved on (the daemon tells the Master, which shows it to the renter). ``keeper``: where
        the output of a deleted container is kept for the Master (None: it is not kept). ``host_keys``: the workloads'
        SSH host keys, whose public half a create's result carries for the Master to publish (docs/ssh.md). ``data``:
        moves the object storage of containers that name some (agent/storage/; None: such a create fails).
        ``private_paths``: this host's directories and the label a failed command's words show instead (agent/redact.py).
        ``worker_apis``: the worker API of each endpoint worker container (agent/worker_api.py; None: such a create fails)."""
        self.agent_id = agent_id
        self.ledger = ledger
        self.runtime = runtime
        self.verifier = verifier
        self.host_gpus = host_gpus
        self.on_pull_progress = on_pull_progress
        self.keeper = keeper
        self.overlays = overlays  # gang replicas' private networks (docs/overlay.md); None: this host runs none
        self.host_keys = host_keys
        self.data = data
        self.private_paths = dict(private_paths or {})
        self.worker_apis = worker_apis
        self._placing = asyncio.Lock()  # GPU check and create, one command at a time

    async def execute(self, command: Command) -> CommandResult:
        """Return the command's result, running it only if this host has never run, nor refused, that id.

        Raises UnansweredCopy for a copy that does not verify of an id this host started and did not finish."""
        body = command.body
        try:
            self._verify(command)
        except SignatureError as exc:
            return self._refuse(body.id, body.kind, exc)
        done = self.ledger.get(body.id)
        if done is not None and done.finished:
            return _result(done)
        if done is None and body.deadline < time.time():
            return self._finish(
                body.id,
                body.kind,
                ok=False,
                result={},
                error="deadline passed before the command arrived",
                code="deadline_passed",
            )
        self.ledger.start(body.id, body.kind)  # on disk before the runtime acts
        try:
            info = await self._run(body.id, body.kind, body.spec, resumed=done is not None)
        except IdlegridError as exc:
            return self._finish(body.id, body.kind, ok=False, result={}, error=self._words(body.spec, str(exc)), code=exc.code)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            error = self._words(body.spec, f"invalid spec: {exc}")
            return self._finish(body.id, body.kind, ok=False, result={}, error=error, code="invalid_spec")
        result: dict[str, Any] = {"container": msgspec.to_builtins(info) if info is not None else None}
        if body.kind == "delete_container" and self.keeper is not None:
            kept = self.keeper.get(body.spec.get("name", ""))
            if kept is not None:  # sizes only: the bytes go through a tunnel, never on the control link
                result["output"] = {"bytes": kept.seen, "kept": kept.kept, "truncated": kept.truncated}
        workload = info.labels.get(LABEL_WORKLOAD_ID, "") if info is not None else ""
        if body.kind == "create_container" and self.host_keys is not None and workload:
            result["ssh_host_key"] = self.host_keys.public_line(workload)
        return self._finish(body.id, body.kind, ok=True, result=result, error=None, code=None)

    def _refuse(self, command_id: str, kind: str, exc: SignatureError) -> CommandResult:
        """A copy that does not verify. Its refusal is the id's end on this host, kept like a result: the Master ends
        the command on it, so a later copy (a resend on reconnect, intact or not) must get the same answer and never
        run. An id this host already ran keeps its own end (the Master hears what happened, not this copy); one whose
        run a restart cut short may have its container already, so this copy ends nothing (UnansweredCopy)."""
        log.warning("refused command %s: %s", command_id, exc)
        entry = self.ledger.refuse(command_id, kind, error=f"{REFUSED_PREFIX}{exc}", error_code=exc.code)
        if not entry.finished:
            raise UnansweredCopy(f"command {command_id} was started here and is not finished; this copy: {exc}")
        return _result(entry)

    def _words(self, spec: dict[str, Any], text: str) -> str:
        """A failure's words as the Master (and the renter) may read them: no secret of the spec, no path of this host."""
        try:
            secrets = secrets_of(parse_create_spec(spec)) if "image" in spec else []
        except (msgspec.ValidationError, ValueError, TypeError):
            secrets = [v for v in (spec.get("env") or {}).values() if isinstance(v, str)]
        return redact(text, secrets, self.private_paths)

    def _verify(self, command: Command) -> None:
        body = command.body
        if body.agent_id != self.agent_id:
            raise SignatureError(f"command is addressed to {body.agent_id}, not to this agent ({self.agent_id})")
        self.verifier.verify(body.key_id, signing_bytes(body), command.signature)

    async def _run(self, command_id: str, kind: str, spec: dict[str, Any], *, resumed: bool) -> ContainerInfo | None:
        if kind == "create_container":
            container = parse_create_spec(spec)
            if self.overlays is not None:
                container = self.overlays.prepare(container, self.runtime)  # torchrun's variables, the hostfile, the interface
            labels = {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: self.agent_id}
            if container.rental_id:
                labels[LABEL_RENTAL_ID] = container.rental_id
            if container.workload_id:
                labels[LABEL_WORKLOAD_ID] = container.workload_id
            if container.replica is not None:
                labels[LABEL_REPLICA] = str(container.replica)
            if container.ports:  # the signed command's ports, kept with the container for agent/tunnel.py to check
                labels[LABEL_PORTS] = ",".join(map(str, container.ports))
            worker_mounts: list[Mount] = []
            if container.endpoint_worker is not None:  # its worker API is served before it starts (again, if resumed)
                if self.worker_apis is None:
                    raise RuntimeFailure("this agent serves no endpoint workers")
                container, worker_mounts = await self.worker_apis.prepare(container, self.runtime)
            if resumed:
                # Started before a crash: the runtime knows whether the container came to be.
                existing = await self.runtime.find(LABEL_COMMAND_ID, command_id)
                if existing:
                    if self.worker_apis is not None:
                        self.worker_apis.started(container.name)
                    return existing[0]
            if isinstance(self.runtime, PullsImages):  # outside the lock: a pull may take minutes
                await self.runtime.ensure_image(container, on_progress=self._progress_of(container.name))
            mounts: list[Mount] = []
            if container.storage is not None:  # outside the lock too: inputs and a checkpoint may take minutes
                if self.data is None:
                    raise RuntimeFailure("this agent moves no object storage (no data plane configured)")
                mounted = isinstance(self.runtime, MountsData)
                host_paths = not mounted or getattr(self.runtime, "host_paths", True)
                data_root = getattr(self.runtime, "data_root", "")  # the process runtime's /idlegrid; docker: the spec's paths
                container, mounts = await self.data.prepare(container, host_paths=host_paths, data_root=data_root)
            mounts += worker_mounts
            try:
                async with self._placing:
                    gpus = await self._claimable_gpus(container, command_id)
                    if gpus:
                        labels[LABEL_GPUS] = ",".join(gpus)
                    if mounts and isinstance(self.runtime, MountsData):
                        info = await self.runtime.create_mounted(container, labels=labels, mounts=mounts)
                    else:
                        info = await self.runtime.create(container, labels=labels)
            except BaseException:
                if self.data is not None and container.storage is not None:
                    await self.data.discard(container.name)
                if self.worker_apis is not None:
                    await self.worker_apis.close(container.name, tell=False)
                raise
            if self.overlays is not None:
                await self.overlays.attach(container, self.runtime)
            if self.worker_apis is not None:
                self.worker_apis.started(container.name)
            return info
        if kind == "delete_container":
            target = parse_delete_spec(spec)
            if self.overlays is not None:
                await self.overlays.detach(target.name)
            if self.worker_apis is not None:  # its requests go back to the queue
                await self.worker_apis.close(target.name)
            if self.keeper is None:
                deleted = await self.runtime.delete(target.name, timeout_s=target.timeout_s)
            else:
                # Its output is kept as it goes (what it printed is the renter's, read later by the Master).
                deleted = await self.keeper.keep_through_delete(self.runtime, target.name, timeout_s=target.timeout_s)
            if self.data is not None:  # stopped: its last checkpoint and outputs go up, then its data leaves the host
                await self.data.finish(target.name)
            return deleted
        raise IdlegridError(f"this agent does not know the command kind {kind!r}", code="unknown_command")

    def _progress_of(self, name: str) -> Callable[[PullProgress], None] | None:
        report = self.on_pull_progress
        if report is None:
            return None
        return lambda progress: report(name, progress)

    async def _claimable_gpus(self, container: ContainerSpec, command_id: str) -> list[str]:
        """The UUIDs of the GPUs (or MIG instances) ``container`` asks for, once sure each is on this host and free
        here. A whole GPU and any of its MIG instances exclude each other, both ways."""
        if not container.gpus:
            return []
        host_gpus = list(self.host_gpus())
        by_id = {gpu.uuid: gpu.uuid for gpu in host_gpus}
        by_id.update({str(gpu.index): gpu.uuid for gpu in host_gpus})
        parent = {mig.uuid: gpu.uuid for gpu in host_gpus for mig in gpu.mig_instances}
        by_id.update({uuid: uuid for uuid in parent})
        unknown = [gpu for gpu in container.gpus if gpu not in by_id]
        if unknown:
            raise UnknownGpu(
                f"container {container.name!r} asks for GPU(s) {', '.join(unknown)}, which this host does not have; "
                f"it has {', '.join(sorted(set(by_id.values()))) or 'no GPUs'}"
            )
        wanted = [by_id[gpu] for gpu in container.gpus]
        held: dict[str, str] = {}  # uuid (GPU or MIG instance) -> the running container holding it
        for other in await self.runtime.list():
            if other.state != RUNNING or other.labels.get(LABEL_COMMAND_ID) == command_id:
                continue  # a repeat of this very command is the runtime's to answer (same container back)
            for gpu in filter(None, other.labels.get(LABEL_GPUS, "").split(",")):
                held[gpu] = other.name
        instances_held = {parent[uuid]: name for uuid, name in held.items() if uuid in parent}  # GPU -> a holder
        taken = [f"{gpu} (held by container {held[gpu]!r})" for gpu in wanted if gpu in held]
        taken += [
            f"{gpu} (its MIG instances are in use by container {instances_held[gpu]!r})"
            for gpu in wanted
            if gpu not in held and gpu in instances_held
        ]
        taken += [
            f"{gpu} (its GPU {parent[gpu]} is held whole by container {held[parent[gpu]]!r})"
            for gpu in wanted
            if gpu not in held and gpu in parent and parent[gpu] in held
        ]
        if taken:
            raise GpuConflict(
                f"container {container.name!r} cannot start: GPU {', '.join(taken)} is in use on this host; "
                "delete that container first, or ask for another GPU"
            )
        return wanted

    def _finish(
        self, command_id: str, kind: str, *, ok: bool, result: dict, error: str | None, code: str | None
    ) -> CommandResult:
        self.ledger.finish(command_id, kind, ok=ok, result=result, error=error, error_code=code)
        return CommandResult(id=command_id, ok=ok, result=result, error=error, error_code=code)

    def pending_results(self) -> list[CommandResult]:
        return [_result(entry) for entry in self.ledger.unacked()]


def _result(entry: CommandLogEntry) -> CommandResult:
    return CommandResult(id=entry.id, ok=bool(entry.ok), result=entry.result, error=entry.error, error_code=entry.error_code)
