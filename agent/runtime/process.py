"""Containers without an engine: each one a process session on the host, for hosts with no Docker and for the demo.

What this runtime is and is not:

- The spec's ``image`` is recorded but not used: the command runs on the host's own filesystem, as the agent's user.
  It isolates nothing; it is for trusted workloads, demos and tests.
- GPUs: ``CUDA_VISIBLE_DEVICES`` is set to the spec's GPUs (empty when none, so CUDA sees no device).
- Memory: ``RLIMIT_AS`` (address space, not resident memory). CUDA reserves far more address space than it uses,
  so a GPU workload wants the docker runtime rather than a memory limit here.
- CPU: a coarse limit. The process is pinned to ``ceil(cpus)`` cores, preferring cores no other container holds;
  half a CPU becomes one whole core.

Each container is a ``/bin/sh`` shim in a new session that waits on a pipe for "go", then runs the command and
writes its exit code to a file. The agent sets the limits and writes the record (pid and kernel start time, which
tells a live process from a reused pid) before it sends "go", so a command never runs without a record: an agent
killed in between leaves a shim that reads end-of-file and exits without running anything. Records live in
``<state_dir>/containers/<name>.json``, so a new agent process finds, inspects and deletes what an old one started;
the processes themselves, in their own sessions, live through an agent restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import msgspec

from agent.runtime.base import STATE_REMOVED, check_same_command, container_labels
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure
from common.files import write_atomically

MIB = 1024 * 1024
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
# The shim runs nothing unless the agent wrote the record first (see the module's docstring). Its trap (a handler,
# which exec resets, not an ignore, which the command would inherit) keeps it alive through a SIGTERM to the session
# until the command itself has exited, so "running" means the command runs and the code written is the command's.
SHIM = """trap : TERM INT HUP
exit_file=$1; shift
IFS= read -r go
[ "$go" = go ] || exit 125
"$@"
code=$?
echo "$code" > "$exit_file"
exit "$code"
"""
KILL_GRACE_S = 5.0  # how long SIGKILLed processes get to disappear before delete gives up
POLL_S = 0.05


class ProcessRecord(msgspec.Struct, kw_only=True):
    """What survives the agent: enough to find the process again and to know it is still the same one."""

    id: str
    name: str
    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat
    labels: dict[str, str]
    spec: ContainerSpec
    created_at: float
    cores: list[int] = []


class ProcessRuntime:
    """A ``ContainerRuntime`` that runs each spec's command as a host process session."""

    name = "process"

    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir) / "containers"
        self.root.mkdir(parents=True, exist_ok=True)
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # by record id: the processes this instance started

    # --- the ContainerRuntime interface -------------------------------------------------------------

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        # No await from the look-up to the record being written, so two creates on this loop cannot interleave.
        wanted = container_labels(spec, labels)
        existing = self._load(spec.name)
        if existing is not None:
            return check_same_command(self._info(existing), wanted)
        return self._info(self._launch(spec, wanted))

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        record = self._load(name)
        if record is None:
            return None
        await _end_session(record, timeout_s)
        await self._reaped(record)
        info = self._info(record)
        self._forget(record)
        return msgspec.structs.replace(info, state=STATE_REMOVED)

    async def inspect(self, name: str) -> ContainerInfo | None:
        record = self._load(name)
        return self._info(record) if record is not None else None

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return [self._info(r) for r in self._records() if r.labels.get(label_key) == label_value]

    async def list(self) -> list[ContainerInfo]:
        return [self._info(r) for r in self._records() if LABEL_COMMAND_ID in r.labels]

    async def close(self) -> None:
        """Nothing to stop: containers outlive the agent by design, and reaper threads are daemons."""

    # --- launching ----------------------------------------------------------------------------------

    def _launch(self, spec: ContainerSpec, labels: dict[str, str]) -> ProcessRecord:
        if not spec.command:
            raise RuntimeFailure(
                f"container {spec.name!r} has no command; the process runtime runs the spec's command on the host "
                f"and cannot use the image's default ({spec.image!r} is not used)"
            )
        workdir = self._workdir(spec.name)
        env = child_env(spec, home=workdir)
        _require_executable(spec, env["PATH"], workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        exit_file = self._path(spec.name, ".exit")
        exit_file.unlink(missing_ok=True)
        with open(self._path(spec.name, ".log"), "ab") as log:
            proc = subprocess.Popen(
                [SHELL, "-c", SHIM, "idlegrid-shim", str(exit_file), *spec.command],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        try:
            record = self._record(spec, labels, proc.pid)
            _apply_limits(proc.pid, spec, record.cores)
            self._save(record)
        except BaseException:
            proc.kill()  # never got "go": nothing of the command ran
            proc.communicate()
            self._discard(spec.name)
            raise
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        self._adopt(record, proc)
        return record

    def _record(self, spec: ContainerSpec, labels: dict[str, str], pid: int) -> ProcessRecord:
        ticks = _stat(pid)
        if ticks is None:  # the shim is still waiting for "go" and unreaped, so /proc/<pid> must exist
            raise RuntimeFailure(f"the process started for container {spec.name!r} vanished at once")
        return ProcessRecord(
            id=uuid.uuid4().hex,
            name=spec.name,
            pid=pid,
            start_ticks=ticks[2],
            labels=labels,
            spec=spec,
            created_at=time.time(),
            cores=self._pick_cores(spec.cpus),
        )

    def _pick_cores(self, cpus: float | None) -> list[int]:
        if cpus is None:
            return []
        allowed = sorted(os.sched_getaffinity(0))
        held = Counter(core for r in self._records() if _alive(r) for core in r.cores)
        least_held = sorted(allowed, key=lambda core: (held[core], core))
        return sorted(least_held[: min(len(allowed), math.ceil(cpus))])

    def _adopt(self, record: ProcessRecord, proc: subprocess.Popen[bytes]) -> None:
        """Reap the child as soon as it exits (no zombies while this agent is its parent) and keep its status."""
        self._children[record.id] = proc
        threading.Thread(target=proc.wait, name=f"reap-{record.name}", daemon=True).start()

    async def _reaped(self, record: ProcessRecord) -> None:
        """When this instance is the parent, wait for the reaper so the exit status is known."""
        proc = self._children.get(record.id)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, KILL_GRACE_S)

    # --- state --------------------------------------------------------------------------------------

    def _info(self, record: ProcessRecord) -> ContainerInfo:
        running = _alive(record)
        return ContainerInfo(
            id=record.id,
            name=record.name,
            runtime=self.name,
            state="running" if running else "exited",
            labels=record.labels,
            exit_code=None if running else self._exit_code(record),
        )

    def _exit_code(self, record: ProcessRecord) -> int | None:
        try:
            return int(self._path(record.name, ".exit").read_text())
        except (OSError, ValueError):
            pass  # killed before the shim could write it, or not finished writing
        proc = self._children.get(record.id)
        code = proc.poll() if proc is not None else None
        if code is not None and code < 0:
            return 128 - code  # killed by a signal: the shell's (and Docker's) convention
        return code

    def _records(self) -> list[ProcessRecord]:
        names = sorted(path.stem for path in self.root.glob("*.json"))
        return [record for record in map(self._load, names) if record is not None]

    def _load(self, name: str) -> ProcessRecord | None:
        try:
            return msgspec.json.decode(self._path(name, ".json").read_bytes(), type=ProcessRecord)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError) as exc:
            raise RuntimeFailure(f"the record of container {name!r} in {self.root} is unreadable: {exc}") from exc

    def _save(self, record: ProcessRecord) -> None:
        write_atomically(self._path(record.name, ".json"), msgspec.json.encode(record))

    def _forget(self, record: ProcessRecord) -> None:
        self._discard(record.name)
        self._children.pop(record.id, None)

    def _discard(self, name: str) -> None:
        for suffix in (".json", ".exit", ".log"):
            self._path(name, suffix).unlink(missing_ok=True)
        shutil.rmtree(self._workdir(name), ignore_errors=True)

    def _path(self, name: str, suffix: str) -> Path:
        return self.root / f"{name}{suffix}"

    def _workdir(self, name: str) -> Path:
        return self.root / f"{name}.d"


def child_env(spec: ContainerSpec, *, home: Path) -> dict[str, str]:
    """A small base, the spec's variables, then the GPU set, which the renter's env must not widen."""
    env = {"PATH": BASE_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpus)
    return env


def _require_executable(spec: ContainerSpec, path: str, workdir: Path) -> None:
    program = spec.command[0]
    found = os.access(workdir / program, os.X_OK) if "/" in program else shutil.which(program, path=path)
    if not found:
        raise RuntimeFailure(
            f"command {program!r} of container {spec.name!r} is not an executable on this host (PATH={path}); "
            f"the process runtime runs commands on the host itself and does not use the image {spec.image!r}"
        )


def _apply_limits(pid: int, spec: ContainerSpec, cores: list[int]) -> None:
    # Set on the waiting shim rather than in a preexec_fn (unsafe once the agent has threads); the command,
    # forked after "go", inherits both.
    try:
        if spec.memory_mib is not None:
            limit = spec.memory_mib * MIB
            resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        if cores:
            os.sched_setaffinity(pid, cores)
    except OSError as exc:
        raise RuntimeFailure(f"cannot apply the limits of container {spec.name!r}: {exc}") from exc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks) of ``pid``, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[3]), int(fields[19])


def _alive(record: ProcessRecord) -> bool:
    stat = _stat(record.pid)
    return stat is not None and stat[2] == record.start_ticks and stat[0] not in "ZX"


def _session_members(record: ProcessRecord) -> list[int]:
    """Live processes of the container's session: the shim and everything it started that did not call setsid."""
    leader = _stat(record.pid)
    if leader is not None and leader[2] != record.start_ticks:
        # Linux reuses no pid still in use as a session id, so the number being taken means our session is over.
        return []
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        # The shim's descendants started no earlier than it: older processes in a same-numbered session are not ours.
        if stat is not None and stat[1] == record.pid and stat[2] >= record.start_ticks and stat[0] not in "ZX":
            members.append(int(entry.name))
    return members


async def _end_session(record: ProcessRecord, timeout_s: float) -> None:
    """SIGTERM the whole session, SIGKILL what is left after ``timeout_s``."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_GRACE_S)):
        members = _session_members(record)
        if not members:
            return
        _signal(members, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and members:
            await asyncio.sleep(POLL_S)
            members = _session_members(record)
        if not members:
            return
    raise RuntimeFailure(f"processes {members} of container {record.name!r} survived SIGKILL")


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)
