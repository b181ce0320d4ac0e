"""Containers without an engine: each one a sandboxed process tree on the host, for hosts with no Docker and the demo.

What this runtime is and is not:

- Never the agent's default (that is ``docker``), and the Master offers its hosts to renters only when the operator
  allows it: it keeps a command away from the agent and from other containers, but shares the host's kernel,
  filesystem and network.
- The spec's ``image`` is recorded but not used: the command runs on the host's own filesystem.
- As root, each container runs as a uid and gid of its own from a reserved range (``user="dynamic"``, the default;
  ``uids``), with no new privileges, in a working directory of its own (``<work_root>/<name>``, 0700, owned by it,
  in a ``work_root`` of the agent's, 0700, seen at ``/idlegrid/work``; its storage at ``/idlegrid/mnt<path>``, from
  the agent's 0700 ``storage_dir``; a gang replica's hostfile at ``/idlegrid/overlay/hostfile``, read-only, from
  beside its record: no other uid has a path to any), with fresh ``/tmp``, ``/var/tmp``,
  ``/dev/shm`` and ``/run/lock`` in a mount namespace of its own, and a network namespace of its own with outbound
  access through slirp4netns and none to the host's loopback (``network="private"``). The agent's state directory is
  0700 and its key and database 0600: isolation ``sandbox``. agent/runtime/process_sandbox.py builds all of that. An
  agent that is not root cannot switch users, and an empty ``user`` asks it not to: the command then runs as the
  agent's own user and the runtime reports isolation ``none``.
- In PID and mount namespaces of its own with its own ``/proc`` (``unshare --pid --fork --kill-child --mount
  --mount-proc``, util-linux): it sees and can signal only its own processes, and CUDA, which needs the ``/proc``
  of its PID namespace, works. The shim is the namespace's init, so when it dies the kernel kills everything the
  command started, ``setsid`` and double forks included. Delete SIGTERMs every process of the namespace, then
  SIGKILLs what is left.
- GPUs: ``CUDA_VISIBLE_DEVICES`` is set to the spec's NVIDIA GPUs (empty when none, so CUDA sees no device), and
  ``ROCR_VISIBLE_DEVICES`` to its AMD cards (empty when none), with the groups owning their device files kept
  (agent/runtime/gpu_access.py).
- Memory: ``RLIMIT_AS`` (address space, not resident memory). CUDA reserves far more address space than it uses,
  so a GPU workload wants the docker runtime rather than a memory limit here.
- CPU: a coarse limit. The process is pinned to ``ceil(cpus)`` cores, preferring cores no other container holds;
  half a CPU becomes one whole core.

- Renter access: logs from the container's log file; exec joins the container's PID, mount and network namespaces
  (``nsenter``) with its limits, user, working directory and environment, on pipes or a pty
  (agent/runtime/process_exec.py); connect opens a socket inside the container's network namespace and reaches its
  127.0.0.1 (the host's 127.0.0.1 when the container shares the host's network).

Each container is a ``/bin/sh`` shim that waits on a pipe for "go", then runs the command and writes its exit code
to a file the agent opened for it (the command itself cannot open it). The agent sets the limits and writes
the record (the shim's pid, its kernel start time, which tells a live process from a reused pid, and its PID
namespace) before it sends "go", so a command never runs without a record: an agent killed in between leaves a
shim that reads end-of-file and exits without running anything. Records live in
``<state_dir>/containers/<name>.json``, so a new agent process finds, inspects and deletes what an old one started;
the processes themselves, in their own sessions, live through an agent restart.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import math
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec

from agent.runtime import process_sandbox as sandbox
from agent.runtime.base import ENV_CONTAINER, STATE_REMOVED, STDOUT, ExecSession, Mount, check_same_command, container_labels
from agent.runtime.gpu_access import AMD, GpuDevices, GpuPlan, device_groups
from agent.runtime.process_exec import start_exec
from agent.runtime.selftest import SELFTEST_RETRY, Probe, SelfTestRetry, reach_in_containers
from agent.state import PRIVATE_FILE_MODE, private_dir
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec
from common.errors import BadCommand, ConfigError, RuntimeFailure
from common.files import write_atomically
from common.inventory import GpuInfo, GpuReach
from common.overlay import fence_route, hostfile_text

log = logging.getLogger(__name__)

MIB = 1024 * 1024
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
UNSHARE = sandbox.UNSHARE
PRLIMIT = "prlimit"
TASKSET = "taskset"
SETSID = "setsid"
DEFAULT_USER = sandbox.USER_DYNAMIC
SANDBOX_USER_NAME = "renter"  # the name a container's programs are told they run as (child_env)
# The shim's standard error is the exit file, which only the agent could open: the command's own standard error goes
# to the log with its output, and the shim writes the command's exit code there. (The shell cannot redirect a file
# descriptor numbered above 9, so the exit file cannot simply be passed as one more descriptor.)
# The shim runs nothing unless the agent wrote the record first (see the module's docstring). Its trap (a handler,
# which exec resets, not an ignore, which the command would inherit) keeps it alive through a SIGTERM to the
# namespace until the command itself has exited, so "running" means the command runs and the code written is the
# command's. As the namespace's init it only receives signals it has a handler for, and SIGKILL from outside.
SHIM = """trap : TERM INT HUP
IFS= read -r go
[ "$go" = go ] || exit 125
"$@" 2>&1
code=$?
echo "$code" >&2
exit "$code"
"""
SHIM_NAME = "idlegrid-shim"  # the shim's $0: its argv[3] once the sandbox's set-up has exec'd into it
KILL_GRACE_S = 5.0  # how long SIGKILLed processes get to disappear before delete gives up
SPAWN_TIMEOUT_S = 5.0  # how long unshare gets to start the namespace's init
POLL_S = 0.05
MAX_LAUNCH_ERROR_CHARS = 300
LOG_CHUNK = 64 * 1024
LOG_POLL_S = 0.1  # how often a followed log is read again while its container runs
CONNECT_TIMEOUT_S = 5.0
# The GPU self-test's probe in a sandboxed container given one GPU: NVML sees that GPU (by its UUID, as the container's
# CUDA_VISIBLE_DEVICES names it), and the CUDA driver initializes and counts exactly one device.
PROCESS_GPU_PROBE = (
    "sh",
    "-c",
    'nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$CUDA_VISIBLE_DEVICES" || exit 3\n'
    "command -v python3 >/dev/null || exit 0\n"
    "exec python3 -c 'import ctypes, sys\n"
    'cuda = ctypes.CDLL("libcuda.so.1"); count = ctypes.c_int()\n'
    "status = cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count))\n"
    'print("cuda status", status, "devices", count.value)\n'
    "sys.exit(0 if status == 0 and count.value == 1 else 4)'",
)
SIMULATED_PROBE = ("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"')
SIMULATED_AMD_PROBE = ("sh", "-c", 'echo "$ROCR_VISIBLE_DEVICES"')
# AMD's: ROCm's rocminfo (on the host) lists the cards ROCR_VISIBLE_DEVICES shows the container's user; exactly one, its
# own, must be listed (uuids in lower case, as the agent writes them).
PROCESS_AMD_PROBE = (
    "sh",
    "-c",
    'command -v rocminfo >/dev/null 2>&1 || { echo "rocminfo not found: ROCm is not installed on this host"; exit 3; }\n'
    'out=$(rocminfo 2>&1) || { echo "rocminfo failed: $out" | tail -n 5; exit 3; }\n'
    "seen=$(echo \"$out\" | grep -o 'GPU-[0-9A-Fa-f]*' | tr A-F a-f)\n"
    'echo "$seen"\n'
    'count=$(echo "$seen" | grep -c GPU-)\n'
    '[ "$count" -eq 1 ] || { echo "rocminfo lists $count GPUs, not one"; exit 4; }',
)
PROCESS_AMD_FIX = (
    "check that ROCm is installed on the host (rocminfo lists the card), that /dev/kfd and the card's /dev/dri/renderD* "
    "may be opened by the containers' uids through their group (render or video), and that the card has a unique id "
    "(ROCR_VISIBLE_DEVICES names cards by it); then restart the agent"
)
PROCESS_GPU_FIX = (
    "check that the NVIDIA driver is loaded (nvidia-smi works on the host), that its device files /dev/nvidia* may be "
    "opened by the containers' uids (process_uids), and that util-linux's unshare supports --mount-proc; then restart "
    "the agent"
)
ISOLATION_SANDBOX = "sandbox"
ISOLATION_NONE = "none"


class ProcessRecord(msgspec.Struct, kw_only=True):
    """What survives the agent: enough to find the process again and to know it is still the same one."""

    id: str
    name: str
    pid: int  # the shim: init of the container's PID namespace, as the host numbers it
    start_ticks: int  # field 22 of /proc/<pid>/stat
    pid_namespace: str = ""  # readlink of /proc/<pid>/ns/pid, e.g. "pid:[4026532281]"
    uid: int | None = None  # the container's own uid (and gid), or None: the agent's user
    private_network: bool = False  # a network namespace of its own, with slirp4netns as its way out
    slirp_pid: int = 0  # that slirp4netns, and its start time (0: none)
    slirp_start_ticks: int = 0
    labels: dict[str, str]
    spec: ContainerSpec
    created_at: float
    cores: list[int] = []


class ProcessRuntime:
    """A ``ContainerRuntime`` that runs each spec's command as a sandboxed process tree on the host."""

    name = "process"

    def __init__(
        self,
        state_dir: str | Path,
        *,
        user: str = DEFAULT_USER,
        work_root: str | Path | None = None,
        uids: str = sandbox.DEFAULT_UIDS,
        network: str = sandbox.NETWORK_PRIVATE,
        simulated_gpus: bool = False,
        selftest_timeout_s: float = 60.0,
        selftest_retry: SelfTestRetry = SELFTEST_RETRY,
        gpu_table: GpuDevices | None = None,
    ) -> None:
        """``gpu_table``: the host's GPUs by uuid and vendor (agent/runtime/gpu_access.py), which the agent keeps
        current; without one every GPU is taken for NVIDIA's."""
        state = Path(state_dir)
        self.root = private_dir(private_dir(state) / "containers")
        self.work_root = Path(work_root) if work_root is not None else state.parent / f"{state.name}-work"
        self.work_root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # the agent's: a container reaches its own working directory by its bind only
            os.chmod(self.work_root, 0o700)
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # by record id: the processes this instance started
        self._root = os.geteuid() == 0
        self.simulated_gpus = simulated_gpus  # the agent's GPUs are simulated: the self-test looks for names only
        self.selftest_timeout_s = selftest_timeout_s
        self.selftest_retry = selftest_retry
        self.gpu_table = gpu_table if gpu_table is not None else GpuDevices()
        self._uids = _container_uids(user, uids) if self._root else None
        if network not in sandbox.NETWORKS:
            raise ConfigError(f"process_network {network!r}: choose one of {', '.join(sandbox.NETWORKS)}")
        # Making a network namespace and handing it to slirp4netns takes root; an agent that is not root reports
        # isolation "none" anyway.
        self._private_network = network == sandbox.NETWORK_PRIVATE and self._root
        if self._uids is None:
            why = "the agent is not root, so it cannot switch users" if user else "process_user is empty"
            log.warning(
                "%s: process-runtime commands run as the agent's own user and could read its files; reporting isolation 'none'",
                why,
                extra={"uid": os.geteuid()},
            )
        self.isolation = ISOLATION_SANDBOX if self._uids is not None else ISOLATION_NONE
        # As root, a container sees its working directory and its storage (agent/storage/) at fixed paths under
        # /idlegrid in its mount namespace; without root there are no set-up mounts, and the container (the agent's
        # own user) sees the host paths.
        self.host_paths = not self._root
        self.data_root = "" if self.host_paths else str(sandbox.SANDBOX_DATA_ROOT)
        # Where a gang replica reads its hostfile (agent/overlay.py names it in IDLEGRID_HOSTFILE): written by this
        # runtime at the create and bound there read-only; "" without root, where the overlay's own file is used.
        self.hostfile = "" if self.host_paths else str(sandbox.SANDBOX_HOSTFILE)
        if self._root:
            sandbox.ensure_data_root()

    # --- the ContainerRuntime interface -------------------------------------------------------------

    async def probe(self) -> None:
        """Ready whenever util-linux is there: checked here so a host without it says so before taking work."""
        for tool in (UNSHARE, sandbox.SETPRIV, PRLIMIT, TASKSET, sandbox.NSENTER, SETSID, sandbox.MOUNT):
            if shutil.which(tool) is None:
                raise RuntimeFailure(f"the process runtime needs {tool!r} (util-linux) on PATH; install util-linux")
        if self._private_network and shutil.which(sandbox.SLIRP4NETNS) is None:
            raise RuntimeFailure(
                "the process runtime gives each container a network of its own through slirp4netns, which is not on "
                'PATH: install it (Debian: apt-get install slirp4netns) or set process_network = "host" on a '
                "trusted host (containers then reach the host's loopback services)"
            )

    async def create_mounted(self, spec: ContainerSpec, *, labels: Mapping[str, str], mounts: Sequence[Mount]) -> ContainerInfo:
        return await self.create(spec, labels=labels, mounts=mounts)

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str], mounts: Sequence[Mount] = ()) -> ContainerInfo:
        # No await from the look-up to the record being written, so two creates on this loop cannot interleave.
        wanted = container_labels(spec, labels)
        existing = self._load(spec.name)
        if existing is not None:
            return check_same_command(self._info(existing), wanted)
        return self._info(self._launch(spec, wanted, mounts))

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        record = self._load(name)
        if record is None:
            return None
        await _end_namespace(record, timeout_s)
        _end_slirp(record)
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

    # --- renter access -------------------------------------------------------------------------------

    async def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        """From the container's ``.log``, where its output and errors land together (all on STDOUT). Following
        polls the file while the container runs, then sends what was written before it ended."""
        record = self._require(name)
        try:
            log_file = open(self._path(name, ".log"), "rb")
        except FileNotFoundError:
            raise RuntimeFailure(f"container {name!r} was deleted from this host") from None
        with log_file:
            log_file.seek(_tail_offset(log_file, tail))
            while True:
                running = follow and _alive(record)  # asked before reading, so nothing written before the end is lost
                while chunk := log_file.read(LOG_CHUNK):
                    yield STDOUT, chunk
                if not running:
                    return
                await asyncio.sleep(LOG_POLL_S)

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        """In the container's PID namespace (so delete ends it too), with its limits, user, working directory and
        environment; in a session of its own, whose controlling terminal is a new pty when ``tty``."""
        if not command:
            raise RuntimeFailure(f"nothing to run in container {name!r}: the command is empty")
        record = self._require_running(name)
        if record.uid is None and self._uids is not None:
            # Started by an agent from before uids per container (as a shared user, which its record does not name):
            # an exec would run as root. Refused; the workload's next start is sandboxed as now.
            raise RuntimeFailure(
                f"container {name!r} was started by an older agent without a uid of its own; restart the workload to exec into it"
            )
        cols, rows = (cols, rows) if cols > 0 and rows > 0 else (80, 24)  # no size given: a terminal's usual
        workdir = self.workdir(name)
        env = child_env(record.spec, home=self._home(workdir), gpus=self.gpu_table.plan(record.spec.gpus))
        if tty:
            env.setdefault("TERM", "xterm")  # as Docker sets it for a terminal; the container's own env wins
        session = [SETSID, "--ctty"] if tty else [SETSID]
        argv = [
            *sandbox.enter_argv(record.pid, workdir=self._home(workdir), root=self._root, private_network=record.private_network),
            *session,
            *_limits(record.spec, record.cores),
            *sandbox.drop_privileges_argv(record.uid, gpus=bool(record.spec.gpus), device_groups=self._gpu_groups(record.spec)),
            *command,
        ]
        return await start_exec(argv, env=env, cwd=workdir, tty=tty, cols=cols, rows=rows, container=name)

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The container's 127.0.0.1:``port``: inside its network namespace, or the host's when it shares that."""
        record = self._require_running(name)
        try:
            if not record.private_network:
                return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT_S)
            sock = sandbox.socket_in_namespace(record.pid)
            try:
                sock.setblocking(False)
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), CONNECT_TIMEOUT_S)
            except BaseException:
                sock.close()
                raise
            return await asyncio.open_connection(sock=sock)
        except ConnectionRefusedError:
            raise RuntimeFailure(f"nothing listens on port {port} of container {name!r} (127.0.0.1:{port})") from None
        except (OSError, TimeoutError) as exc:
            raise RuntimeFailure(f"cannot connect to port {port} of container {name!r}: {exc}") from exc

    async def close(self) -> None:
        """Nothing to stop: containers outlive the agent by design, and reaper threads are daemons."""

    async def gpu_selftest(self, gpus: Sequence[GpuInfo]) -> builtins.list[GpuReach]:
        """Each GPU in a sandboxed container of its own (agent/runtime/selftest.py): NVML there sees its UUID and,
        where the host has python3, the CUDA driver initializes and counts one device (what failed with error 304
        before containers had their own /proc)."""
        return await reach_in_containers(
            self, gpus, image="none", probe=self._probe, timeout_s=self.selftest_timeout_s, retry=self.selftest_retry
        )

    def _probe(self, gpu: GpuInfo) -> Probe:
        """The self-test of ``gpu``: by name for simulated GPUs, else its vendor's probe (agent/runtime/selftest.py)."""
        amd = self.gpu_table.vendor(gpu.uuid) == AMD
        if self.simulated_gpus:
            return Probe(SIMULATED_AMD_PROBE if amd else SIMULATED_PROBE, expect=gpu.uuid, fix=PROCESS_GPU_FIX)
        if amd:
            return Probe(PROCESS_AMD_PROBE, expect=gpu.uuid.lower(), fix=PROCESS_AMD_FIX)
        return Probe(PROCESS_GPU_PROBE, expect=gpu.uuid, fix=PROCESS_GPU_FIX)

    def _gpu_groups(self, spec: ContainerSpec) -> tuple[int, ...]:
        """The groups owning the device files of the spec's AMD cards (none for simulated cards, which have none)."""
        plan = self.gpu_table.plan(spec.gpus)
        return device_groups(plan.devices) if plan.amd and not self.simulated_gpus else ()

    def workdir(self, name: str) -> Path:
        """The container's working directory and HOME on the host, owned by the user it runs as."""
        return self.work_root / name

    def _home(self, workdir: Path) -> Path:
        """Where the container sees its working directory: a fixed path as root, else the host's."""
        return Path(sandbox.SANDBOX_WORKDIR) if self._root else workdir

    # --- launching ----------------------------------------------------------------------------------

    def _launch(self, spec: ContainerSpec, labels: dict[str, str], mounts: Sequence[Mount] = ()) -> ProcessRecord:
        if not spec.command:  # the renter's spec, not the host: the workload fails without blaming it
            raise BadCommand(
                f"container {spec.name!r} has no command; the process runtime runs the spec's command on the host "
                f"and cannot use the image's default ({spec.image!r} is not used)"
            )
        workdir = self.workdir(spec.name)
        env = child_env(spec, home=self._home(workdir), gpus=self.gpu_table.plan(spec.gpus))
        _require_executable(spec, env["PATH"], workdir)
        exit_file = self._path(spec.name, ".exit")
        exit_file.unlink(missing_ok=True)
        cores = self._pick_cores(spec.cpus)
        uid = self._pick_uid()
        self._make_workdir(workdir, uid)
        _give_data(mounts, uid)
        shim = [SHELL, "-c", SHIM, SHIM_NAME, *spec.command]
        setup = sandbox.setup_script(
            private_tmp=uid is not None,
            tmpfs_size_mib=spec.memory_mib,
            resolv_conf=sandbox.write_resolv_conf(self.root / "resolv.conf") if self._private_network else None,
            binds=[
                *(sandbox.Bind(m.host, sandbox.data_path(m.container), m.writable) for m in mounts),
                *self._overlay_binds(spec),
            ],
        )
        launch = [
            *sandbox.sandbox_argv(root=self._root, private_network=self._private_network, setup=setup),
            *_limits(spec, cores),
            *sandbox.drop_privileges_argv(uid, gpus=bool(spec.gpus), device_groups=self._gpu_groups(spec)),
            *shim,
        ]
        exit_fd = os.open(exit_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        try:
            with open(self._path(spec.name, ".log"), "ab") as output:
                os.fchmod(output.fileno(), PRIVATE_FILE_MODE)
                proc = subprocess.Popen(
                    launch,
                    stdin=subprocess.PIPE,
                    stdout=output,
                    stderr=exit_fd,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                )
        finally:
            os.close(exit_fd)
        return self._start(spec, labels, proc, cores, uid)

    def _overlay_binds(self, spec: ContainerSpec) -> builtins.list[sandbox.Bind]:
        """A gang replica's overlay files (its hostfile, from its spec) at ``SANDBOX_OVERLAY``, read-only: written into
        ``<name>.overlay`` beside its record, in the agent's 0700 directory, so no other uid has a path to them (the
        overlay's own directory, agent/overlay.py, is the agent's alone too). Root's, 0755 and 0444: its uid reads
        them through the bind and can change nothing."""
        if spec.overlay is None or self.host_paths:
            return []
        files = self._path(spec.name, ".overlay")
        files.mkdir(mode=0o755, exist_ok=True)
        os.chmod(files, 0o755)
        write_atomically(files / sandbox.SANDBOX_HOSTFILE.name, hostfile_text(spec.overlay).encode(), mode=0o444)
        return [sandbox.Bind(files, sandbox.SANDBOX_OVERLAY, writable=False)]

    def _pick_uid(self) -> int | None:
        """A uid no container of this host holds (records of exited containers hold theirs until deleted)."""
        if self._uids is None:
            return None
        return self._uids.pick({r.uid for r in self._records() if r.uid is not None})

    def _make_workdir(self, workdir: Path, uid: int | None) -> None:
        workdir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)

    def _start(
        self,
        spec: ContainerSpec,
        labels: dict[str, str],
        proc: subprocess.Popen[bytes],
        cores: builtins.list[int],
        uid: int | None,
    ) -> ProcessRecord:
        slirp: subprocess.Popen[bytes] | None = None
        try:
            init = _namespace_init(proc, spec.name, self._path(spec.name, ".exit"))
            _await_shim(init, proc, spec.name, self._path(spec.name, ".log"))
            record = self._record(spec, labels, init, cores, uid)
            if self._private_network:
                slirp = sandbox.start_slirp(init, self._path(spec.name, ".net.log"))
                slirp_stat = _stat(slirp.pid)
                record = msgspec.structs.replace(
                    record, slirp_pid=slirp.pid, slirp_start_ticks=slirp_stat[2] if slirp_stat else 0
                )
                if spec.overlay is not None:  # before "go": not one packet to a peer leaves by the default route
                    sandbox.route_in_namespace(init, fence_route(spec.overlay))
            self._save(record)
        except BaseException:
            proc.kill()  # never got "go": nothing of the command ran (--kill-child takes the shim along)
            proc.communicate()
            if slirp is not None:
                slirp.kill()
                slirp.wait()
            self._discard(spec.name)
            raise
        assert proc.stdin is not None
        try:
            proc.stdin.write(b"go\n")
            proc.stdin.close()
        except BrokenPipeError:  # the sandbox's set-up failed before the shim read "go": nothing of the command ran
            proc.wait()
            said = self._path(spec.name, ".log").read_text(errors="replace").strip()[-MAX_LAUNCH_ERROR_CHARS:]
            if slirp is not None:
                slirp.kill()
                slirp.wait()
            self._discard(spec.name)
            raise RuntimeFailure(f"could not set up the sandbox of container {spec.name!r}: {said or 'no message'}") from None
        self._adopt(record, proc)
        if slirp is not None:
            threading.Thread(target=slirp.wait, name=f"reap-net-{record.name}", daemon=True).start()
        return record

    def _record(
        self, spec: ContainerSpec, labels: dict[str, str], pid: int, cores: builtins.list[int], uid: int | None
    ) -> ProcessRecord:
        ticks = _stat(pid)
        namespace = _pid_namespace(pid)
        if ticks is None or namespace is None:  # the shim is still waiting for "go", so /proc/<pid> must exist
            raise RuntimeFailure(f"the process started for container {spec.name!r} vanished at once")
        return ProcessRecord(
            id=uuid.uuid4().hex,
            name=spec.name,
            pid=pid,
            start_ticks=ticks[2],
            pid_namespace=namespace,
            labels=labels,
            spec=spec,
            created_at=time.time(),
            cores=cores,
            uid=uid,
            private_network=self._private_network,
        )

    def _pick_cores(self, cpus: float | None) -> builtins.list[int]:
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
        """The code the shim wrote; none written means the shim was SIGKILLed (by delete, or the OOM killer): as the
        namespace's init it receives no other signal it has no handler for, and it writes before it exits."""
        try:
            return int(self._path(record.name, ".exit").read_text())
        except (OSError, ValueError):
            return 128 + signal.SIGKILL  # the shell's (and Docker's) convention for a process killed by a signal

    def _require(self, name: str) -> ProcessRecord:
        record = self._load(name)
        if record is None:
            raise RuntimeFailure(f"no container named {name!r} on this host (process runtime, {self.root})")
        return record

    def _require_running(self, name: str) -> ProcessRecord:
        record = self._require(name)
        if not _alive(record):
            raise RuntimeFailure(f"container {name!r} is not running (it is exited, exit code {self._exit_code(record)})")
        return record

    async def network_namespace(self, name: str) -> str | None:
        """The path of a running container's own network namespace (a gang's overlay runs in it, docs/overlay.md);
        None when it shares the host's network or does not run."""
        record = self._load(name)
        if record is None or not record.private_network or not _alive(record):
            return None
        return f"/proc/{record.pid}/ns/net"

    def _records(self) -> builtins.list[ProcessRecord]:
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
        write_atomically(self._path(record.name, ".json"), msgspec.json.encode(record), mode=PRIVATE_FILE_MODE)

    def _forget(self, record: ProcessRecord) -> None:
        self._discard(record.name)
        self._children.pop(record.id, None)

    def _discard(self, name: str) -> None:
        for suffix in (".json", ".exit", ".log", ".net.log"):
            self._path(name, suffix).unlink(missing_ok=True)
        shutil.rmtree(self._path(name, ".overlay"), ignore_errors=True)
        shutil.rmtree(self.workdir(name), ignore_errors=True)

    def _path(self, name: str, suffix: str) -> Path:
        return self.root / f"{name}{suffix}"


def _give_data(mounts: Sequence[Mount], uid: int | None) -> None:
    """The container's data becomes its own uid's: the checkpoint and output directories (and what a restore put
    there) wholly, 0700 at the top; the input directories 0500 (the files in them stay the agent's 0444 links to the
    input cache, read-only: agent/storage/cache.py). No other uid reaches any of them: the directories above are the
    agent's, 0700 (agent/storage/plane.py), and the container sees its own through binds only."""
    if uid is None:
        return
    for mount in mounts:
        for dirpath, dirs, files in os.walk(mount.host):
            if mount.writable:
                for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
                    os.lchown(entry, uid, uid)
            else:
                os.chown(dirpath, uid, uid)
                os.chmod(dirpath, 0o500)
        if mount.writable:
            os.chmod(mount.host, 0o700)


def child_env(spec: ContainerSpec, *, home: Path, gpus: GpuPlan | None = None) -> dict[str, str]:
    """A small base, the spec's variables, then the GPU set, which the renter's env must not widen: NVIDIA's GPUs in
    ``CUDA_VISIBLE_DEVICES``, AMD's in ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``, and, for a container
    without AMD cards, an empty ``ROCR_VISIBLE_DEVICES`` (none: the process runtime's containers see the host's
    device files). ``gpus``: the spec's GPUs split by vendor (agent/runtime/gpu_access.py); without it, NVIDIA's.

    ``USER`` and ``LOGNAME``: a sandboxed container runs as a uid of its own that has no passwd entry, and programs ask
    who they are (Python's ``getpass.getuser()`` reads these first, then the passwd file: PyTorch's optimizers import
    its compiler, whose cache directory is named after the user, and every training job failed on a real H100 with
    "getpwuid(): uid not found")."""
    env = {"PATH": BASE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "USER": SANDBOX_USER_NAME, "LOGNAME": SANDBOX_USER_NAME}
    env.update(spec.env)
    env[ENV_CONTAINER] = spec.name
    plan = gpus if gpus is not None else GpuPlan(nvidia=tuple(spec.gpus))
    env.update(plan.visible_env())  # CUDA's: GPU uuids, indexes or MIG instance uuids ("MIG-…")
    env.update(plan.hidden_amd_env())
    env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] or "none"  # for tools that read the toolkit's name
    return env


def _tail_offset(log_file: BinaryIO, lines: int) -> int:
    """Where the last ``lines`` lines of the file begin (-1: all of it); a last line without its newline counts."""
    end = log_file.seek(0, os.SEEK_END)
    if lines < 0:
        return 0
    if lines == 0:
        return end
    position, newlines = end, 0
    log_file.seek(max(end - 1, 0))
    skip_last = log_file.read(1) == b"\n"  # the newline that ends the last line does not start another
    while position > 0:
        start = max(position - LOG_CHUNK, 0)
        log_file.seek(start)
        block = log_file.read(position - start)
        if skip_last and position == end:
            block = block[:-1]
            position -= 1
        index = len(block)
        while (index := block.rfind(b"\n", 0, index)) >= 0:
            newlines += 1
            if newlines == lines:
                return start + index + 1
        position = start
    return 0


def _require_executable(spec: ContainerSpec, path: str, workdir: Path) -> None:
    program = spec.command[0]
    found = os.access(workdir / program, os.X_OK) if "/" in program else shutil.which(program, path=path)
    if not found:
        raise BadCommand(
            f"command {program!r} of container {spec.name!r} is not an executable on this host (PATH={path}); "
            f"the process runtime runs commands on the host itself and does not use the image {spec.image!r}"
        )


def _limits(spec: ContainerSpec, cores: list[int]) -> list[str]:
    """util-linux commands that set the container's limits on themselves and exec on: the agent may lack
    CAP_SYS_RESOURCE (as in a container), so it could not set them later on a process of another user."""
    argv = []
    if spec.memory_mib is not None:
        limit = spec.memory_mib * MIB
        argv += [PRLIMIT, f"--as={limit}:{limit}", "--"]
    if cores:
        argv += [TASKSET, "--cpu-list", ",".join(map(str, cores))]  # taskset takes no "--"
    return argv


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


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def _namespace_init(launcher: subprocess.Popen[bytes], name: str, exit_file: Path) -> int:
    """The host pid of the shim: the child unshare forked into the new PID namespace."""
    ours = _pid_namespace(os.getpid())
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for pid in map(int, children.read_text().split()):
                if _pid_namespace(pid) not in (None, ours):
                    return pid
        if launcher.poll() is not None:
            break
        time.sleep(POLL_S / 10)
    said = exit_file.read_text(errors="replace").strip()[-MAX_LAUNCH_ERROR_CHARS:]  # unshare's own complaint
    raise RuntimeFailure(
        f"could not start container {name!r} in a PID namespace of its own ({UNSHARE} exited with "
        f"{launcher.poll()}: {said or 'no message'}); the process runtime needs util-linux and, unless the agent "
        "runs as root, unprivileged user namespaces"
    )


def _await_shim(pid: int, launcher: subprocess.Popen[bytes], name: str, log_path: Path) -> None:
    """Wait until the namespace's init is the shim (its sandbox set up: the mounts are in place, so an exec that
    enters right after finds the container as it will stay); the set-up's complaint when it failed instead."""
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if len(argv) > 3 and argv[3] == SHIM_NAME.encode():
                return
        if launcher.poll() is not None:
            break
        time.sleep(POLL_S / 10)
    said = log_path.read_text(errors="replace").strip()[-MAX_LAUNCH_ERROR_CHARS:]
    raise RuntimeFailure(f"could not set up the sandbox of container {name!r}: {said or 'it did not start in time'}")


def namespace_members(record: ProcessRecord) -> list[int]:
    """Live processes in the container's PID namespace: the shim and everything the command started, whatever it
    did (setsid, double forks) to leave its session."""
    init = _stat(record.pid)
    if init is None or init[2] != record.start_ticks:
        # The init is gone (and with it, by the kernel's hand, the namespace's processes) or its pid reused.
        return []
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        # Started no earlier than the shim: a namespace id can only be reused after this one is gone.
        if stat is None or stat[0] in "ZX" or stat[2] < record.start_ticks:
            continue
        if _pid_namespace(pid) == record.pid_namespace:
            members.append(pid)
    return members


async def _end_namespace(record: ProcessRecord, timeout_s: float) -> None:
    """SIGTERM every process of the namespace, SIGKILL what is left after ``timeout_s``."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_GRACE_S)):
        members = namespace_members(record)
        if not members:
            return
        _signal(members, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and members:
            await asyncio.sleep(POLL_S)
            members = namespace_members(record)
        if not members:
            return
    raise RuntimeFailure(f"processes {members} of container {record.name!r} survived SIGKILL")


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)


def _end_slirp(record: ProcessRecord) -> None:
    """Stop the container's slirp4netns (it would hold the emptied network namespace open), if it is still that one."""
    stat = _stat(record.slirp_pid) if record.slirp_pid else None
    if stat is not None and stat[2] == record.slirp_start_ticks:
        sandbox.kill_quietly(record.slirp_pid, signal.SIGKILL)


def _container_uids(user: str, uids: str) -> sandbox.UidRange | None:
    """The uids containers get, or None when they run as the agent's own user (``user`` empty: the operator's choice,
    for a trusted host or a test grid that must see what commands write)."""
    if not user:
        return None
    if user != sandbox.USER_DYNAMIC:  # a user name, as settings before uids per container said (default "nobody")
        log.warning(
            "process_user %r: one user shared by every container no longer exists; each container runs as a uid of its "
            'own from process_uids (set process_user = %r to say so, or "" for the agent\'s own user)',
            user,
            sandbox.USER_DYNAMIC,
        )
    parsed = sandbox.UidRange.parse(uids)
    for entry in pwd.getpwall():
        if parsed.first <= entry.pw_uid <= parsed.last:
            raise ConfigError(
                f"process_uids {uids!r} holds uid {entry.pw_uid} of user {entry.pw_name!r}: choose a range no user has"
            )
    return parsed
