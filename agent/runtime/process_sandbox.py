"""The process runtime's sandbox: the namespaces, identity and network one container gets (see docs/security.md).

Pure argv builders plus the two pieces of I/O that need the kernel's help: starting ``slirp4netns`` on a container's
network namespace, and opening a socket inside that namespace for a renter's port tunnel.

As root, each container gets:

- its own PID namespace with its own ``/proc`` (``unshare --pid --fork --mount --mount-proc``): it sees only its own
  processes, cannot name (so cannot signal or ptrace) anyone else's, and CUDA finds the ``/proc`` of its namespace
  (without it ``cudaGetDeviceCount`` fails with error 304);
- its own mount namespace, where a small root-run set-up step mounts fresh ``tmpfs`` on the host's shared writable
  places (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``) and, with a private network, a ``resolv.conf`` naming
  slirp4netns's DNS forwarder, then execs the command's shim;
- its own uid and gid from a reserved range (``process_uids``, a uid nobody else on the host uses), no supplementary
  groups but the GPU devices' group when that is what guards them, and no new privileges (``setpriv``);
- its files at fixed paths, under a small tmpfs of root's that the set-up step mounts on ``/idlegrid`` (an empty
  directory of the host, made by the agent): its working directory and HOME at ``/idlegrid/work``, its data
  (agent/storage/: inputs, outputs, the checkpoint) at ``/idlegrid/mnt<path in the spec>``, inputs read-only, each
  bound from its host directory; a gang replica's hostfile at ``/idlegrid/overlay/hostfile`` (docs/overlay.md),
  read-only. Those lie in directories of the agent's that no other uid may traverse (0700), so a bind is the only
  way to them: another container, which may know every host path, has none, whatever modes the program gives its
  files; and an agent whose state lies under a home directory (0700) works as well as one under /tmp;
- its own network namespace (``unshare --net``) with outbound access through ``slirp4netns`` started with
  ``--disable-host-loopback``: the host's loopback services (the agent's, other containers', a relay on the same
  machine) are out of its reach, and a tunnel reaches only the container's own ports.

An agent that is not root gets a user namespace instead (it cannot switch users), still its own PID namespace and
``/proc``, and the host's network: its runtime reports isolation ``none``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shlex
import socket
import stat
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from common.errors import ConfigError, RuntimeFailure

UNSHARE = "unshare"
NSENTER = "nsenter"
SETPRIV = "setpriv"
MOUNT = "mount"
SLIRP4NETNS = "slirp4netns"
SHELL = "/bin/sh"

USER_DYNAMIC = "dynamic"  # process_user: a uid and gid of its own per container, from process_uids
NETWORK_PRIVATE = "private"  # process_network: a namespace of its own, outbound through slirp4netns
NETWORK_HOST = "host"  # process_network: the host's (a trusted host, or an agent that is not root)
NETWORKS = (NETWORK_PRIVATE, NETWORK_HOST)
DEFAULT_UIDS = "1000000-1065535"  # a range no distribution hands out to users (they stop at 60000 or 65533)
SLIRP_DNS = "10.0.2.3"  # slirp4netns's built-in forwarder to the host's resolvers
SLIRP_MTU = 65520
SLIRP_READY_TIMEOUT_S = 5.0
TAP_DEVICE = "tap0"
CLONE_NEWNET = 0x40000000
# The writable places every user of a host shares: each container gets fresh ones in its mount namespace.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
GPU_CONTROL_DEVICE = Path("/dev/nvidiactl")
# Where a container sees its own files: a fresh root-owned tmpfs in its mount namespace, holding only its working
# directory and its data, bound there. Not a place on PATH nor a system directory, so binding directories a renter
# writes there cannot change what the set-up step or an exec (both root until setpriv) run.
SANDBOX_ROOT = PurePosixPath("/idlegrid")
SANDBOX_WORKDIR = SANDBOX_ROOT / "work"
SANDBOX_DATA_ROOT = SANDBOX_ROOT / "mnt"
SANDBOX_OVERLAY = SANDBOX_ROOT / "overlay"  # a gang replica's overlay files, read-only (docs/overlay.md)
SANDBOX_HOSTFILE = SANDBOX_OVERLAY / "hostfile"  # its IDLEGRID_HOSTFILE
SANDBOX_TMPFS = "mode=0755,nosuid,nodev,size=1m"


@dataclass(frozen=True)
class Bind:
    """A host directory a container sees at ``inside`` (its data under ``SANDBOX_DATA_ROOT``, a gang replica's overlay
    files at ``SANDBOX_OVERLAY``), read-only unless ``writable``."""

    host: Path
    inside: PurePosixPath
    writable: bool


def data_path(container_path: str) -> PurePosixPath:
    """Where a container sees the spec's ``container_path`` (absolute, no ``..``: common/storage.py checks it at
    submit; checked again here, since a path leaving ``SANDBOX_DATA_ROOT`` would be bound by root over the host's own
    directories in the container's view)."""
    rel = PurePosixPath(container_path.lstrip("/"))
    if not container_path.startswith("/") or not rel.parts or any(part in (".", "..") for part in rel.parts):
        raise RuntimeFailure(f"{container_path!r} is not a directory path in the container (absolute, not '/', no '..')")
    return SANDBOX_DATA_ROOT / rel


def ensure_data_root() -> None:
    """The empty directory of the host that each container's own tmpfs is mounted on (root's, 0755)."""
    root = Path(SANDBOX_ROOT)
    try:
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o755)
        found = root.lstat()
    except OSError as exc:
        raise ConfigError(
            f"the process runtime mounts each container's own files on {root}, which it cannot make ({exc.strerror}): "
            f"create it (mkdir -m 0755 {root}, owned by root) and restart the agent"
        ) from exc
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0:
        raise ConfigError(
            f"{root} must be a directory of root's (the process runtime mounts each container's data there); "
            "it is something else on this host: remove it and restart the agent"
        )


@dataclass(frozen=True)
class UidRange:
    """The uids (each also the gid) handed to containers, one each while the container's record exists."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange:
        first_text, sep, last_text = text.partition("-")
        try:
            first, last = int(first_text), int(last_text) if sep else int(first_text)
        except ValueError:
            raise ConfigError(f"process_uids {text!r} is not a range of uids such as {DEFAULT_UIDS!r}") from None
        if not 1000 <= first <= last < 2**31 - 1:
            raise ConfigError(
                f"process_uids {text!r}: choose uids from 1000 up to {2**31 - 2}, the first no larger than the last, "
                "that no user of the host has"
            )
        return cls(first, last)

    def pick(self, taken: set[int]) -> int:
        """The lowest uid of the range no live container holds."""
        for uid in range(self.first, self.last + 1):
            if uid not in taken:
                return uid
        raise RuntimeFailure(
            f"all {self.last - self.first + 1} uids of process_uids ({self.first}-{self.last}) are held by containers "
            "on this host: delete some or widen the range"
        )


def setup_script(*, private_tmp: bool, tmpfs_size_mib: int | None, resolv_conf: Path | None, binds: Sequence[Bind] = ()) -> str:
    """What root runs first in the container's new mount namespace (private: nothing propagates to the host), before
    exec'ing the rest of its argv.

    It starts in the container's working directory (its host path). First, while every host path is still the
    host's: a small tmpfs on ``SANDBOX_ROOT``, the working directory bound at ``SANDBOX_WORKDIR`` through
    ``/proc/self/cwd`` (not canonicalized, which would resolve the name anew), each of ``binds`` (its data,
    agent/storage/, under ``SANDBOX_DATA_ROOT``; a gang replica's overlay files at ``SANDBOX_OVERLAY``) bound there and
    remounted nosuid and nodev (and read-only unless writable).
    Root makes the binds, so the container's uid needs no way through the directories above them. Then fresh tmpfs on
    the shared places, which hide whatever lay below them in this namespace only. ``private_tmp`` is off for a
    container that runs as the agent's own user (a trusted host's choice, isolation "none"): it shares the host's
    places as it shares its files."""
    size = f",size={tmpfs_size_mib}m" if tmpfs_size_mib else ""
    for bind in binds:  # root binds them: nothing is ever bound over the host's own directories or the working one
        inside = bind.inside
        if not inside.is_relative_to(SANDBOX_ROOT) or ".." in inside.parts or inside in (SANDBOX_ROOT, SANDBOX_WORKDIR):
            raise RuntimeFailure(f"{inside} is not a place for a container's files (below {SANDBOX_ROOT})")
    steps = []
    if resolv_conf is not None:
        steps.append(f"{MOUNT} --bind -o ro {shlex.quote(str(resolv_conf))} /etc/resolv.conf || exit 126")
    steps.append(f"{MOUNT} -t tmpfs -o {SANDBOX_TMPFS} idlegrid {SANDBOX_ROOT} || exit 126")
    steps.append(f"mkdir {SANDBOX_WORKDIR} && {MOUNT} --no-canonicalize --bind /proc/self/cwd {SANDBOX_WORKDIR} || exit 126")
    for bind in binds:
        where = shlex.quote(str(bind.inside))
        flags = "nosuid,nodev" if bind.writable else "ro,nosuid,nodev"
        steps.append(f"mkdir -p {where} && {MOUNT} --bind {shlex.quote(str(bind.host))} {where} || exit 126")
        steps.append(f"{MOUNT} -o remount,bind,{flags} {where} || exit 126")
    for place in SHARED_WRITABLE if private_tmp else ():
        steps.append(f"if [ -d {place} ]; then {MOUNT} -t tmpfs -o mode=1777,nosuid,nodev{size} tmpfs {place} || exit 126; fi")
    steps.append(f"cd {SANDBOX_WORKDIR} || exit 126")
    return "\n".join([*steps, 'exec "$@"'])


def sandbox_argv(*, root: bool, private_network: bool, setup: str) -> list[str]:
    """Puts what follows in new PID and mount namespaces (and a network one), as their init, with its own /proc."""
    namespaces = ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
    if not root:  # a user namespace is what lets an unprivileged user make the others; no set-up mounts there
        return [UNSHARE, "--user", "--map-current-user", *namespaces, "--"]
    net = ["--net"] if private_network else []
    return [UNSHARE, *namespaces, *net, "--", SHELL, "-c", setup, "idlegrid-setup"]


def enter_argv(pid: int, *, workdir: Path, root: bool, private_network: bool) -> list[str]:
    """Into the namespaces of the container whose init is ``pid`` (forking into its PID namespace), in its working
    directory (entering a mount namespace otherwise leaves nsenter at its root)."""
    joins = ["--pid", "--mount", f"--wdns={workdir}"]
    if not root:
        return [NSENTER, f"--target={pid}", "--user", "--preserve-credentials", *joins, "--"]
    net = ["--net"] if private_network else []
    return [NSENTER, f"--target={pid}", *joins, *net, "--"]


def drop_privileges_argv(uid: int | None, *, gpus: bool, device_groups: Sequence[int] = ()) -> list[str]:
    """Become the container's own user, with no way back; keep the GPU devices' groups when they guard them: NVIDIA's
    control device's, and ``device_groups`` (those owning an AMD card's /dev/kfd and render node: render, video)."""
    if uid is None:
        return []
    nvidia = gpu_device_group() if gpus else None
    kept = [gid for gid in ([nvidia] if nvidia is not None else []) + list(device_groups)]
    kept = list(dict.fromkeys(kept))
    groups = [f"--groups={','.join(map(str, kept))}"] if kept else ["--clear-groups"]
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", *groups, "--no-new-privs", "--"]


def gpu_device_group() -> int | None:
    """The group of the NVIDIA control device when only its group may open it (drivers set up with NVreg_DeviceFileGID)."""
    try:
        mode = GPU_CONTROL_DEVICE.stat()
    except OSError:
        return None
    return mode.st_gid if mode.st_mode & 0o006 != 0o006 else None


def write_resolv_conf(path: Path) -> Path:
    """The resolv.conf a private-network container sees: slirp4netns's forwarder, since the host's may be on loopback."""
    text = f"nameserver {SLIRP_DNS}\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        path.chmod(0o644)
    return path


def start_slirp(pid: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Give the network namespace of ``pid`` outbound access, without the host's loopback; wait until it is set up."""
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [
                    SLIRP4NETNS,
                    "--configure",
                    f"--mtu={SLIRP_MTU}",
                    "--disable-host-loopback",
                    "--enable-sandbox",
                    "--enable-seccomp",
                    f"--ready-fd={write_fd}",
                    str(pid),
                    TAP_DEVICE,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                pass_fds=(write_fd,),
                start_new_session=True,  # lives through an agent restart, as the container does
            )
        os.close(write_fd)
        write_fd = -1
        ready, _, _ = select.select([read_fd], [], [], SLIRP_READY_TIMEOUT_S)
        if not ready or os.read(read_fd, 1) != b"1":
            proc.kill()
            proc.wait()
            said = log_path.read_text(errors="replace").strip()[-300:]
            raise RuntimeFailure(f"slirp4netns could not give the container its network ({said or 'no message'})")
        return proc
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def route_in_namespace(pid: int, route: list[str]) -> None:
    """``ip ROUTE...`` in the network namespace of ``pid`` (the agent is root wherever containers have their own)."""
    done = subprocess.run(
        [NSENTER, f"--net=/proc/{pid}/ns/net", "ip", *route], capture_output=True, text=True, timeout=10, check=False
    )
    if done.returncode != 0:
        raise RuntimeFailure(f"could not set the container's route ({' '.join(route)}): {done.stderr.strip()}")


def socket_in_namespace(pid: int) -> socket.socket:
    """A TCP socket created inside the network namespace of ``pid``: connected later from anywhere, it still reaches
    that namespace's addresses. ``setns`` moves only the calling thread, so a short-lived thread of its own does it."""
    result: list[socket.socket | BaseException] = []

    def create() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(target, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the container's network namespace")
            finally:
                os.close(target)
            try:
                result.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            finally:
                if libc.setns(own, CLONE_NEWNET) != 0:  # never expected; this thread ends here anyway
                    result.append(OSError(ctypes.get_errno(), "setns back to the agent's network namespace"))
        except BaseException as exc:  # handed to the caller
            result.append(exc)
        finally:
            os.close(own)

    thread = threading.Thread(target=create, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    failures = [item for item in result if isinstance(item, BaseException)]
    sockets = [item for item in result if isinstance(item, socket.socket)]
    if failures:
        for sock in sockets:
            sock.close()
        raise RuntimeFailure(f"cannot reach the container's network: {failures[0]}")
    return sockets[0]


def kill_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
