"""The overlay client of one replica: Nebula run in the replica's network namespace (docs/overlay.md).

The host's overlay key (X25519) is made here once and kept 0600 in the state directory (``OverlayKey``); its public
half goes to the Master in ``hello``, which signs each replica's certificate for it, so no private key ever travels.
For a replica whose create carries an ``OverlaySpec``, ``OverlayClient`` writes the CA, the certificate, Nebula's
configuration and the hostfile into the replica's overlay directory, starts ``nebula`` inside the replica's network
namespace (``enter``: the command prefix that enters it, ``nsenter --net=/proc/PID/ns/net`` for a container), and
reads Nebula's JSON log to know, for each peer, whether its tunnel is direct or goes through a relay
(``peer_path``).

States of a client: written -> running (nebula started) -> stopped. ``stop`` ends nebula (SIGTERM, then SIGKILL)
and is safe to call twice. A nebula that exits by itself leaves the client ``exited`` with its code.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from agent.state import private_dir, private_file
from common.containers import ContainerSpec
from common.errors import RuntimeFailure
from common.overlay import HOSTFILE_NAME, OverlaySpec, fence_route, hostfile_text, nebula_config, replica_env

__all__ = ["GangOverlays", "OverlayClient", "OverlayError", "OverlayKey", "PeerPath", "peer_path"]

log = logging.getLogger(__name__)

KEY_FILE = "overlay.key"
CONTAINER_HOSTFILE = "/etc/idlegrid-hostfile"  # IDLEGRID_HOSTFILE in a container with files of its own (docker)
SPEC_FILE = "overlay.json"  # a replica's OverlaySpec, kept for the agent's next start
PID_FILE = "nebula.pid"  # "PID START_TICKS" of its nebula: a reused pid is never signalled
PUBLIC_FILE = "overlay.pub"
STOP_GRACE_S = 5.0  # nebula closes its tunnels on SIGTERM; past this it is killed

PeerPath = Literal["direct", "relay"]


class OverlayError(RuntimeError):
    """The overlay cannot run here: no nebula binary, no TUN device, a namespace that cannot be entered."""


@dataclass(frozen=True)
class OverlayKey:
    """The host's Nebula key pair: the private half stays in ``private_path`` (0600)."""

    private_path: Path
    public_pem: str

    @classmethod
    def load_or_create(cls, state_dir: Path) -> OverlayKey:
        from common.nebula import new_host_key

        private_dir(state_dir)
        key_path, public_path = state_dir / KEY_FILE, state_dir / PUBLIC_FILE
        if not (key_path.exists() and public_path.exists()):
            private, public = new_host_key()
            private_file(key_path).write_text(private)
            private_file(public_path).write_text(public)
        return cls(private_path=key_path, public_pem=public_path.read_text())


def peer_path(record: dict[str, object]) -> tuple[str, PeerPath | None] | None:
    """What one line of Nebula's JSON log says about a peer's tunnel: (its overlay address, "direct" or "relay"),
    (address, None) when the tunnel closed, None when the line says nothing of it. A completed handshake names the
    peer's UDP address when direct and none when it came through a relay; a roam names the new UDP address."""
    address = record.get("vpnIp")
    if not isinstance(address, str):
        return None
    message = record.get("msg")
    if message in ("Handshake message received", "Handshake message sent") and "certName" in record:
        return address, ("relay" if record.get("udpAddr") is None else "direct")
    if message == "Host roamed to new udp ip/port.":
        return address, "direct"
    if message == "Close tunnel received, tearing down.":
        return address, None
    return None


class OverlayClient:
    """Nebula for one replica, in its namespace."""

    def __init__(
        self,
        spec: OverlaySpec,
        *,
        workdir: Path,
        key: OverlayKey,
        enter: Sequence[str] = (),
        nebula: str = "nebula",
        hostfile_in_container: str = "",
    ) -> None:
        self.spec = spec
        self.workdir = workdir
        self.key = key
        self.enter = list(enter)
        self.nebula = nebula
        # Where the replica reads the hostfile (a path inside its container); the overlay directory's by default.
        self.hostfile_in_container = hostfile_in_container or str(workdir / HOSTFILE_NAME)
        self.paths: dict[str, PeerPath] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.exit_code: int | None = None
        self._up = asyncio.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=5)  # nebula's last lines, for an error

    @property
    def state(self) -> str:
        if self._process is None:
            return "stopped" if self.exit_code is not None else "written"
        return "running" if self._process.returncode is None else "exited"

    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else 0

    def env(self) -> dict[str, str]:
        """The replica's variables (torchrun's, the hostfile, the interface)."""
        return replica_env(self.spec, self.hostfile_in_container)

    def write(self) -> Path:
        """The CA, certificate, configuration and hostfile; returns the configuration's path."""
        private_dir(self.workdir)
        (self.workdir / "ca.crt").write_text(self.spec.ca)
        (self.workdir / "host.crt").write_text(self.spec.certificate)
        config = nebula_config(
            self.spec,
            ca_path=str(self.workdir / "ca.crt"),
            cert_path=str(self.workdir / "host.crt"),
            key_path=str(self.key.private_path),
        )
        config_path = self.workdir / "nebula.json"
        config_path.write_text(json.dumps(config))
        (self.workdir / HOSTFILE_NAME).write_text(hostfile_text(self.spec))  # for a replica that shares the host's files
        return config_path

    async def start(self) -> None:
        if shutil.which(self.nebula) is None:
            raise OverlayError(f"{self.nebula!r} is not installed: the overlay needs Debian's nebula package")
        config = self.write()
        self._process = await asyncio.create_subprocess_exec(
            *self.enter,
            self.nebula,
            "-config",
            str(config),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._reader = asyncio.create_task(self._read(self._process), name=f"overlay-log-{self.spec.group}-{self.spec.rank}")

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        with open(self.workdir / "nebula.log", "ab", buffering=0) as kept:
            async for line in process.stdout:
                kept.write(line)
                self._tail.append(line.decode(errors="replace").strip())
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                if str(record.get("certName", "")).startswith("lighthouse-"):
                    self._up.set()  # the interface is up and a lighthouse knows where this replica is
                if record.get("level") in ("error", "fatal"):
                    log.warning("overlay: %s", record.get("msg"), extra={"group": self.spec.group, "rank": self.spec.rank})
                seen = peer_path(record)
                if seen is None:
                    continue
                address, path = seen
                if path is None:
                    self.paths.pop(address, None)
                else:
                    self.paths[address] = path
        self.exit_code = await process.wait()

    async def wait_up(self, timeout_s: float) -> None:
        """Until the overlay's interface is up and a lighthouse answered (peers can find this replica), or OverlayError."""
        waiting = asyncio.ensure_future(self._up.wait())
        ended = asyncio.ensure_future(self._reader) if self._reader is not None else waiting
        done, _ = await asyncio.wait({waiting, ended}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._up.is_set():
            return
        raise OverlayError(f"the overlay did not come up within {timeout_s} s: {' | '.join(self._tail)}")

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self.exit_code = process.returncode


class NetworkNamespaces(Protocol):
    """What a runtime that can host an overlay tells: a running container's network namespace, by path."""

    async def network_namespace(self, name: str) -> str | None: ...


class GangOverlays:
    """This host's gang replicas' overlay clients, by container name (the executor's part of docs/overlay.md).

    ``prepare`` adds the replica's variables to its spec before the create (the hostfile's path included);
    ``attach`` starts its overlay once the container runs, in its network namespace, and keeps its spec
    (``overlay.json``) and nebula's pid in the replica's overlay directory; ``detach`` stops it when the container is
    deleted and removes the directory. ``resume``, at the agent's start, starts again the overlay of every replica
    still running (the agent stops them all when it stops: nebula's log is read through a pipe to the agent) and
    removes what is left of the others. A container whose runtime shows no namespace of its own gets no overlay
    (logged): the overlay is never run in the host's own network."""

    def __init__(self, key: OverlayKey, root: Path, *, nebula: str = "nebula") -> None:
        self.key = key
        self.root = root
        self.nebula = nebula
        self.clients: dict[str, OverlayClient] = {}

    @classmethod
    def available(cls, state_dir: Path, *, nebula: str = "nebula") -> GangOverlays | None:
        """The host's overlays when it can run them (root, nebula installed, a TUN device), else None."""
        if os.geteuid() != 0 or shutil.which(nebula) is None or not os.path.exists("/dev/net/tun"):
            return None
        # The agent's alone (certificates, configuration, nebula's log): a replica reads its hostfile where its
        # runtime puts it (``prepare``), never through this directory, which another tenant's uid could reach too.
        root = private_dir(Path(f"{state_dir}-overlay"))
        return cls(OverlayKey.load_or_create(state_dir), root, nebula=nebula)

    def _workdir(self, name: str) -> Path:
        return self.root / name

    def prepare(self, spec: ContainerSpec, runtime: object = None) -> ContainerSpec:
        """``spec`` with the replica's variables. ``IDLEGRID_HOSTFILE`` is where the replica reads its hostfile: in a
        container with files of its own (docker), ``CONTAINER_HOSTFILE``, written into it by ``attach``; in the process
        runtime's sandbox, the fixed path it names (``runtime.hostfile``, /idlegrid/overlay/hostfile), which it writes
        from the spec at the create and binds read-only; else (a replica that shares the host's files as root) the
        overlay directory's own file."""
        if spec.overlay is None:
            return spec
        if hasattr(runtime, "put_file"):
            hostfile = CONTAINER_HOSTFILE
        else:
            hostfile = getattr(runtime, "hostfile", "") or str(self._workdir(spec.name) / HOSTFILE_NAME)
        return msgspec.structs.replace(spec, env={**spec.env, **replica_env(spec.overlay, hostfile)})

    async def attach(self, spec: ContainerSpec, runtime: object) -> None:
        if spec.overlay is not None and spec.name not in self.clients:
            await self._start(spec.name, spec.overlay, runtime)

    async def _start(self, name: str, overlay: OverlaySpec, runtime: object) -> None:
        spec = ContainerSpec(name=name, image="-", overlay=overlay)
        find = getattr(runtime, "network_namespace", None)
        netns = await find(spec.name) if find is not None else None
        if netns is None:
            log.warning(
                "no network namespace of its own: the gang replica runs without its overlay", extra={"container": spec.name}
            )
            return
        workdir = self._workdir(spec.name)
        client = OverlayClient(overlay, workdir=workdir, key=self.key, enter=["nsenter", f"--net={netns}"], nebula=self.nebula)
        await fence(netns, overlay)
        try:
            private_dir(self.root)
            private_dir(workdir)
            (workdir / SPEC_FILE).write_bytes(msgspec.json.encode(overlay))
            await client.start()
            put_file = getattr(runtime, "put_file", None)
            if put_file is not None:  # a container with files of its own: the hostfile goes in
                await put_file(name, CONTAINER_HOSTFILE, hostfile_text(overlay).encode())
            if client.pid:
                (workdir / PID_FILE).write_text(f"{client.pid} {_start_ticks(client.pid)}")
        except (OverlayError, OSError, RuntimeFailure) as exc:
            # The container runs on; without its overlay its peers cannot reach it, and the gang's own timeouts say so.
            log.error("the gang replica's overlay did not start: %s", exc, extra={"container": spec.name})
            return
        self.clients[spec.name] = client

    async def detach(self, name: str) -> None:
        client = self.clients.pop(name, None)
        if client is not None:
            await client.stop()
        workdir = self._workdir(name)
        await _end_recorded(workdir)  # a nebula an earlier agent process started and did not stop
        shutil.rmtree(workdir, ignore_errors=True)

    async def resume(self, runtime: object) -> None:
        """At the agent's start: the overlay of every replica that still runs again; the rest removed."""
        if not self.root.is_dir():
            return
        for workdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            try:
                overlay = msgspec.json.decode((workdir / SPEC_FILE).read_bytes(), type=OverlaySpec)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                overlay = None
            await _end_recorded(workdir)
            find = getattr(runtime, "network_namespace", None)
            running = find is not None and overlay is not None and await find(workdir.name) is not None
            if overlay is None or not running:
                shutil.rmtree(workdir, ignore_errors=True)
                continue
            await self._start(workdir.name, overlay, runtime)

    def paths(self) -> dict[str, dict[str, str]]:
        """Per container, how each peer is reached now ("direct" or "relay")."""
        return {name: {peer: str(path) for peer, path in client.paths.items()} for name, client in self.clients.items()}

    async def close(self) -> None:
        """Stop every overlay, keeping what ``resume`` needs to start them again (the agent is stopping)."""
        clients, self.clients = self.clients, {}
        for client in clients.values():
            await client.stop()


async def fence(netns: str, overlay: OverlaySpec) -> None:
    """The overlay range unreachable in the namespace but through the overlay's interface (common.overlay.fence_route).
    The process runtime sets it before the command starts; a docker container gets it here, once it runs. A failure is
    logged and the overlay starts anyway: while Nebula runs, its interface carries the range."""
    done = await asyncio.create_subprocess_exec(
        "nsenter", f"--net={netns}", "ip", *fence_route(overlay),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, said = await done.communicate()
    if done.returncode != 0:
        log.error(
            "the overlay range is not fenced: while its overlay is down, the replica's traffic to its peers leaves "
            "through its default route (%s)",
            said.decode(errors="replace").strip(),
            extra={"group": overlay.group, "rank": overlay.rank},
        )


def _start_ticks(pid: int) -> str:
    """Field 22 of /proc/PID/stat (when the process started), "" when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


async def _end_recorded(workdir: Path) -> None:
    """SIGKILL the nebula recorded in ``workdir`` if that very process still runs (same pid, same start), and wait
    (up to STOP_GRACE_S) until it is gone: a new nebula in the same namespace needs its TUN device's name."""
    try:
        pid_text, ticks = (workdir / PID_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return
    if ticks and _start_ticks(pid) == ticks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        while _start_ticks(pid) == ticks and not _zombie(pid) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
    (workdir / PID_FILE).unlink(missing_ok=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True
