"""Containers through the Docker Engine API on its unix socket; Podman's Docker-compatible service works too.

Plain HTTP through aiohttp rather than the docker SDK: the agent needs a few endpoints, and one HTTP stack.
A renter's exec takes over its connection, which aiohttp cannot do: see docker_exec.py.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import io
import json
import math
import os
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from agent.runtime.base import ENV_CONTAINER, STATE_REMOVED, STDOUT, ExecSession, Mount, check_same_command, container_labels
from agent.runtime.docker_exec import DockerExecSession, exec_streams, hijack, read_frame
from agent.runtime.gpu_access import AMD, GpuDevices, GpuPlan, device_groups
from agent.runtime.images import (
    ImageAccess,
    ImageLimits,
    ImageUses,
    PullProgress,
    StoredImage,
    auth_header,
    check_registry,
    evictions,
    pull_failure,
    pull_query,
    registry_of,
    too_large,
    warm_first,
)
from agent.runtime.selftest import SELFTEST_RETRY, Probe, SelfTestRetry, reach_in_containers
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec, RegistryAuth
from common.egress import check_registry as check_registry_egress
from common.errors import BadCommand, ConfigError, ImageNotFound, ImagePullTimeout, ImageUnauthorized, RuntimeFailure
from common.inventory import GpuInfo, GpuReach

DEFAULT_SOCKET = "/var/run/docker.sock"
MIB = 1024 * 1024
CPU_PERIOD_US = 100_000  # the CFS period a CPU quota is a share of (what Docker's NanoCpus means)
# DeviceRequests (how the NVIDIA Container Toolkit is asked for GPUs) arrived in API 1.40 (Docker 19.03).
MIN_API_VERSION = (1, 40)

# Every capability is dropped, then these are given back: what images that start as root need to install
# packages and step down to a user (apt, chown of a data dir, gosu/su). Left out of Docker's defaults:
# NET_RAW (forged packets on the provider's network), MKNOD, SETFCAP, SETPCAP, SYS_CHROOT, AUDIT_WRITE.
# Dropping ALL first means a newer engine's defaults can never widen what a renter gets.
# Pauses before inspecting again after Podman answered an inspect that raced the container's exit (_exit_race).
INSPECT_RACE_PAUSES_S = (0.05, 0.2, 0.5)
CONNECT_TIMEOUT_S = 3.0  # to a container's address on the engine's network, before trying through exec
DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID")
# The GPU self-test (agent/runtime/selftest.py): an image with a C library for the nvidia-smi the NVIDIA toolkit
# mounts into it, and the probe that prints the GPUs a container sees (real ones; the simulated ones by name).
DEFAULT_SELFTEST_IMAGE = "docker.io/library/debian:bookworm-slim"
NVIDIA_PROBE = ("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader")
SIMULATED_PROBE = ("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"')
SIMULATED_AMD_PROBE = ("sh", "-c", 'echo "$ROCR_VISIBLE_DEVICES"')
# AMD's: the container opens /dev/kfd and each render node it has, as its own user and groups through the engine's
# device rules, and says which it opened (``opened <node>``); rocminfo, where the image has ROCm, must list a GPU.
AMD_PROBE = (
    "sh",
    "-c",
    'if ! (exec 3<>/dev/kfd) 2>/dev/null; then echo "cannot open /dev/kfd as uid $(id -u), groups $(id -G)"; exit 3; fi\n'
    "for node in /dev/dri/renderD*; do\n"
    '  [ -e "$node" ] || continue\n'
    '  if (exec 3<>"$node") 2>/dev/null; then echo "opened <$node>"; else echo "cannot open $node as uid $(id -u)"; fi\n'
    "done\n"
    "command -v rocminfo >/dev/null 2>&1 || exit 0\n"
    'out=$(rocminfo 2>&1) || { echo "rocminfo failed: $out" | tail -n 5; exit 4; }\n'
    'echo "$out" | grep -q "Device Type: *GPU" || { echo "rocminfo lists no GPU"; exit 4; }',
)
# How a container is given its GPUs: "device_requests" (Docker with the NVIDIA Container Toolkit), "cdi" (Podman's own
# API with CDI devices), "by_name" (no device, only CUDA_VISIBLE_DEVICES: the agent's simulated GPUs), or "auto":
# by_name for simulated GPUs, else cdi on Podman and device_requests on Docker.
GPU_DEVICE_MODES = ("auto", "device_requests", "cdi", "by_name")
PODMAN_ENGINE = "Podman Engine"  # how Podman names itself in /version's Components
CDI_GPU_KIND = "nvidia.com/gpu"  # the NVIDIA Container Toolkit's CDI devices: nvidia.com/gpu=<uuid>
DOCKER_GPU_FIX = (
    "install the NVIDIA Container Toolkit and set Docker up for it (sudo nvidia-ctk runtime configure --runtime=docker "
    "&& sudo systemctl restart docker); check: docker run --rm --gpus all IMAGE nvidia-smi; then restart the agent"
)
PODMAN_GPU_FIX = (
    "install the NVIDIA Container Toolkit and write its CDI specification (sudo nvidia-ctk cdi generate "
    "--output=/etc/cdi/nvidia.yaml); check: podman run --rm --device nvidia.com/gpu=all IMAGE nvidia-smi -L; "
    "then restart the agent"
)
AMD_GPU_FIX = (
    "check that the amdgpu driver is loaded (/dev/kfd and /dev/dri/renderD* exist; amd-smi list shows the card) and that "
    "the engine passes devices: a rootless engine's user must be in the render and video groups (sudo usermod -aG "
    "render,video USER); check: podman run --rm --device /dev/kfd --device /dev/dri/renderD128 IMAGE ls -l /dev/kfd; "
    "then restart the agent"
)
# What engines say when a container's command is not in its image (runc through Docker or Podman): the renter's.
_BAD_COMMAND = ("executable file not found", "no such file or directory")

PullProgressCallback = Callable[[PullProgress], None]


class DockerRuntime:
    """A ``ContainerRuntime`` on a Docker-API engine. Images the host lacks are pulled when ``images.pull`` allows,
    within the host's image limits (agent/runtime/images.py)."""

    name = "docker"
    isolation = "container"

    def __init__(
        self,
        socket: str | Path = DEFAULT_SOCKET,
        *,
        images: ImageLimits | None = None,
        image_state: Path | None = None,
        timeout_s: float = 60.0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
        simulated_gpus: bool = False,
        selftest_image: str = DEFAULT_SELFTEST_IMAGE,
        selftest_timeout_s: float = 60.0,
        selftest_retry: SelfTestRetry = SELFTEST_RETRY,
        gpu_devices: str = "auto",
        network: str = "",
        gpu_table: GpuDevices | None = None,
    ) -> None:
        """``simulated_gpus``: the host's GPUs are the agent's simulation (``--simulate``), so a container is given
        them by name (``CUDA_VISIBLE_DEVICES``) and no device is asked of the engine: there is none to give.
        ``selftest_image``: what the GPU self-test runs its probe in (pulled when ``images.pull``, else it must be here).
        ``gpu_devices``: how a container is given its GPUs (GPU_DEVICE_MODES); ``auto`` picks by engine and simulation.
        ``network``: the containers' network mode (``NetworkMode``, e.g. ``slirp4netns``); "" is the engine's default.
        ``gpu_table``: the host's GPUs by uuid, their vendors and device files (agent/runtime/gpu_access.py), which the
        agent keeps current; without one every GPU is taken for NVIDIA's.
        ``images``: the host's pull settings (default: no pulls, only images already on the host run);
        ``image_state``: the file that records the images the agent pulled and their last use (None: memory only);
        beside it, ``image-access.json`` records who proved access to each image pulled with credentials.

        GPUs reach a container through DeviceRequests on Docker (the NVIDIA Container Toolkit); Podman's Docker API
        ignores those, so on Podman a GPU container is made through Podman's own API with CDI devices
        (``nvidia.com/gpu=<uuid>``, the toolkit's CDI specification). AMD cards reach it as device files on both
        engines (``/dev/kfd`` and the card's render node, with the groups that own them)."""
        self.socket_path = str(socket)
        self.simulated_gpus = simulated_gpus
        self.images = images if images is not None else ImageLimits(pull=False)
        self.image_uses = ImageUses(image_state)
        access_state = image_state.with_name("image-access.json") if image_state is not None else None
        self.image_access = ImageAccess(access_state, pulled_before=self.image_uses.uses)
        self.timeout_s = timeout_s
        self.capabilities = tuple(capabilities)
        if gpu_devices not in GPU_DEVICE_MODES:
            raise ConfigError(f"gpu_devices must be one of {', '.join(GPU_DEVICE_MODES)}, not {gpu_devices!r}")
        self.gpu_devices = gpu_devices
        self.network = network
        self.gpu_table = gpu_table if gpu_table is not None else GpuDevices()
        self.selftest_image = selftest_image
        self.selftest_timeout_s = selftest_timeout_s
        self.selftest_retry = selftest_retry
        self._libpod_version: str | None = None  # Podman's own API version, when the engine is Podman
        self._session: aiohttp.ClientSession | None = None
        self._api_prefix: str | None = None
        self._bridges: set[asyncio.Task[None]] = set()  # connections carried through exec (see ``connect``)

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    # --- the ContainerRuntime interface -------------------------------------------------------------

    async def probe(self) -> None:
        self._api_prefix = None  # ask again: the engine may have gone away, come back or been upgraded since
        await self._negotiate()

    @property
    def engine(self) -> str:
        """``podman`` or ``docker``, as the engine said when last asked (``probe``)."""
        return "podman" if self._libpod_version else "docker"

    def gpu_mode(self) -> str:
        """How this runtime gives a container its GPUs now (``gpu_devices`` with ``auto`` resolved)."""
        if self.gpu_devices != "auto":
            return self.gpu_devices
        if self.simulated_gpus:
            return "by_name"
        return "cdi" if self._libpod_version is not None else "device_requests"

    async def gpu_selftest(self, gpus: Sequence[GpuInfo]) -> builtins.list[GpuReach]:
        """Each GPU in a container of its own, through ``create`` as a renter's would be (agent/runtime/selftest.py)."""
        try:
            await self._negotiate()
            status, _ = await self._call("GET", f"/images/{quote(self.selftest_image, safe='')}/json")
        except RuntimeFailure as exc:
            return [GpuReach(uuid=g.uuid, reachable=False, detail=str(exc)[:500], fix="start the engine") for g in gpus]
        if status == 404 and not self.images.pull:
            # Not the GPUs' fault, but nothing is proven either: say which image is missing and how to get it.
            detail = f"the self-test image {self.selftest_image!r} is not on this host, so no GPU could be tested"
            fix = f"{self.engine} pull {self.selftest_image} (or set gpu_selftest_image to an image on this host)"
            fix += ", then restart the agent"
            return [GpuReach(uuid=g.uuid, reachable=False, detail=detail, fix=fix) for g in gpus]
        return await reach_in_containers(
            self,
            gpus,
            image=self.selftest_image,
            probe=self._probe,
            timeout_s=self.selftest_timeout_s,
            retry=self.selftest_retry,
        )

    def _probe(self, gpu: GpuInfo) -> Probe:
        """The self-test of ``gpu``: by name for simulated GPUs, else its vendor's probe (agent/runtime/selftest.py)."""
        amd = self.gpu_table.vendor(gpu.uuid) == AMD
        if self.gpu_mode() == "by_name":
            return Probe(SIMULATED_AMD_PROBE if amd else SIMULATED_PROBE, expect=gpu.uuid, fix=DOCKER_GPU_FIX)
        if amd:
            node = self.gpu_table.render_node(gpu.uuid)
            return Probe(AMD_PROBE, expect=f"opened <{node}>" if node else "", fix=AMD_GPU_FIX)
        return Probe(NVIDIA_PROBE, expect=gpu.uuid, fix=PODMAN_GPU_FIX if self.gpu_mode() == "cdi" else DOCKER_GPU_FIX)

    host_paths = False  # storage directories are bound at the paths the spec names

    async def create_mounted(self, spec: ContainerSpec, *, labels: Mapping[str, str], mounts: Sequence[Mount]) -> ContainerInfo:
        return await self.create(spec, labels=labels, mounts=mounts)

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str], mounts: Sequence[Mount] = ()) -> ContainerInfo:
        wanted = container_labels(spec, labels)
        raw = await self._inspect_raw(spec.name) or await self._create(spec, wanted, mounts)
        info = check_same_command(_info(raw), wanted)
        if info.state != "created":
            return info  # running or already finished: a repeat delivery, not a second run
        # Ours and never started (a fresh create, or an agent that died between create and start).
        self.image_uses.touch(str(raw.get("Image") or ""), time.time())
        if spec.gpus and self.gpu_mode() in ("device_requests", "cdi"):
            await self._require_gpus(spec, raw)
        await self._start(info)
        return _info(await self._inspect_required(spec.name))

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        raw = await self._inspect_raw(name)
        if raw is None:
            return None
        cid = raw["Id"]
        await self._stop(name, cid, timeout_s)
        stopped = await self._inspect_raw(name) or raw
        status, body = await self._call("DELETE", f"/containers/{cid}", params={"force": "true", "v": "true"})
        if status not in (200, 204, 404):
            raise _failure(f"removing container {name!r}", status, body)
        return msgspec.structs.replace(_info(stopped), state=STATE_REMOVED)

    async def inspect(self, name: str) -> ContainerInfo | None:
        raw = await self._inspect_raw(name)
        return _info(raw) if raw is not None else None

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return await self._list(f"{label_key}={label_value}")

    async def list(self) -> list[ContainerInfo]:
        return await self._list(LABEL_COMMAND_ID)

    # --- renter access -------------------------------------------------------------------------------

    async def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        """Of a running or a finished container; following ends when the container does."""
        raw = await self._existing(name)
        prefix = await self._negotiate()
        params = {"stdout": "1", "stderr": "1", "tail": "all" if tail < 0 else str(tail), "follow": "1" if follow else "0"}
        tty = bool((raw.get("Config") or {}).get("Tty"))  # a tty container's log is its terminal's raw bytes
        timeout = aiohttp.ClientTimeout(total=None if follow else self.timeout_s, sock_connect=self.timeout_s)
        url = f"http://docker{prefix}/containers/{raw['Id']}/logs"
        try:
            async with self._open().get(url, params=params, timeout=timeout) as response:
                if response.status != 200:
                    raise _failure(f"reading the logs of container {name!r}", response.status, _decode(await response.read()))
                if tty:
                    async for chunk in response.content.iter_any():
                        yield STDOUT, chunk
                    return
                while (frame := await read_frame(response.content.readexactly)) is not None:
                    yield frame
        except TimeoutError as exc:
            raise RuntimeFailure(
                f"the Docker API at {self.url} did not send the logs of {name!r} within {self.timeout_s:.0f} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise RuntimeFailure(f"reading the logs of container {name!r} from {self.url} failed: {_reason(exc)}") from exc

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        """As the container's user, in its working directory, with its environment (the engine's defaults)."""
        if not command:
            raise RuntimeFailure(f"nothing to run in container {name!r}: the command is empty")
        raw = await self._running(name)
        cols, rows = (cols, rows) if cols > 0 and rows > 0 else (80, 24)  # no size given: a terminal's usual
        create = {"Cmd": list(command), "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Tty": tty}
        status, body = await self._call("POST", f"/containers/{raw['Id']}/exec", body=create)
        if status != 201 or not isinstance(body, dict) or "Id" not in body:
            raise _failure(f"starting {command[0]!r} in container {name!r}", status, body)
        start: dict[str, Any] = {"Detach": False, "Tty": tty}
        if tty:
            start.update(h=rows, w=cols, ConsoleSize=[rows, cols])  # the first size: Podman reads h/w, Docker ConsoleSize
        prefix = await self._negotiate()
        reader, writer = await hijack(self.socket_path, f"{prefix}/exec/{body['Id']}/start", start, timeout_s=self.timeout_s)
        state = raw.get("State") or {}
        session = DockerExecSession(body["Id"], name, int(state.get("Pid") or 0), reader, writer, tty=tty, call=self._call)
        if tty:
            with contextlib.suppress(RuntimeFailure):  # for engines that took neither: late, but better than 0x0
                await session.resize(cols, rows)
        return session

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Straight to the container's address on the engine's network when the agent can reach it and something
        listens there; otherwise (no network, a rootless engine's unroutable one, a service bound to 127.0.0.1)
        through ``nc 127.0.0.1 PORT`` run in the container, which must then have ``nc`` (busybox has it)."""
        raw = await self._running(name)
        for address in _addresses(raw):
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                continue
        session = await self.exec(name, ["nc", "127.0.0.1", str(port)], tty=False)
        return await exec_streams(session, self._bridges)

    async def close(self) -> None:
        for bridge in builtins.list(self._bridges):
            bridge.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- steps ------------------------------------------------------------------------------------------

    def _cdi_gpus(self, spec: ContainerSpec) -> bool:
        """Whether ``spec`` gets its GPUs as CDI devices through Podman's own API."""
        return bool(spec.gpus) and self.gpu_mode() == "cdi"

    async def _send_create(self, spec: ContainerSpec, labels: dict[str, str], mounts: Sequence[Mount]) -> tuple[int, Any]:
        await self._negotiate()  # which engine: Podman takes GPU containers through its own API
        plan = self.gpu_table.plan(spec.gpus)
        device_requests = self.gpu_mode() == "device_requests"
        if device_requests or self._cdi_gpus(spec):
            plan.require_devices()
        groups = device_groups(plan.devices)
        if self._cdi_gpus(spec):
            if self._libpod_version is None:
                raise RuntimeFailure(f"the engine at {self.url} is not Podman: CDI GPU devices (gpu_devices = cdi) need Podman")
            body = libpod_create_body(spec, labels, self.capabilities, mounts, network=self.network, gpus=plan, groups=groups)
            return await self._call("POST", f"/v{self._libpod_version}/libpod/containers/create", body=body, versioned=False)
        body = create_body(
            spec,
            labels,
            self.capabilities,
            device_requests=device_requests,
            mounts=mounts,
            network=self.network,
            gpus=plan,
            groups=groups,
        )
        return await self._call("POST", "/containers/create", params={"name": spec.name}, body=body)

    async def stop(self, name: str, *, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``, leaving the container (and its output) in place: the agent keeps
        a container's output between its stop and its removal (agent/output.py)."""
        raw = await self._inspect_raw(name)
        if raw is not None:
            await self._stop(name, raw["Id"], timeout_s)

    async def _stop(self, name: str, cid: str, timeout_s: float) -> None:
        stop_after = math.ceil(timeout_s)
        status, body = await self._call(
            "POST", f"/containers/{cid}/stop", params={"t": str(stop_after)}, timeout_s=stop_after + self.timeout_s
        )
        if status not in (204, 304, 404):  # 304: already stopped
            raise _failure(f"stopping container {name!r}", status, body)

    async def _create(self, spec: ContainerSpec, labels: dict[str, str], mounts: Sequence[Mount] = ()) -> dict[str, Any]:
        await self.ensure_image(spec)  # the executor did (with progress); again here, so no create skips the access check
        status, reply = await self._send_create(spec, labels, mounts)
        if _image_missing(status, reply):
            await self.ensure_image(spec)  # the executor pulls first (with progress); this is the late-comer's path
            status, reply = await self._send_create(spec, labels, mounts)
        if _name_in_use(status, reply):
            raced = await self._inspect_raw(spec.name)  # created meanwhile, maybe by a repeat of this command
            if raced is not None:
                return raced
        if status != 201:
            raise _failure(f"creating container {spec.name!r}", status, reply)
        return await self._inspect_required(spec.name)

    async def _start(self, info: ContainerInfo) -> None:
        status, body = await self._call("POST", f"/containers/{info.id}/start")
        if status in (204, 304):
            return
        await self._remove_quietly(info.id)  # a container that cannot start would block its name forever
        failure = _failure(f"starting container {info.name!r}", status, body)
        if any(words in _message(body).lower() for words in _BAD_COMMAND):
            raise BadCommand(f"{failure}; the command is not in the image or cannot run there: fix the workload's command")
        raise failure

    async def _require_gpus(self, spec: ContainerSpec, raw: dict[str, Any]) -> None:
        """A renter paying for GPUs must not get a container without them, so check what the engine kept: NVIDIA's
        device requests on Docker (Podman's CDI devices fail the start instead), AMD's device files on both."""
        plan = self.gpu_table.plan(spec.gpus)
        host = raw.get("HostConfig") or {}
        if self.gpu_mode() == "device_requests":
            granted = {gpu for request in host.get("DeviceRequests") or [] for gpu in request.get("DeviceIDs") or []}
            if not set(plan.nvidia) <= granted:
                await self._remove_quietly(raw["Id"])
                raise RuntimeFailure(
                    f"the engine at {self.url} dropped the request for GPUs {', '.join(plan.nvidia)}; GPU containers need "
                    "Docker with the NVIDIA Container Toolkit, or Podman with its CDI specification"
                )
        given = {str(device.get("PathInContainer") or "") for device in host.get("Devices") or []}
        dropped = [node.container for node in plan.devices if node.container not in given]
        if dropped:
            await self._remove_quietly(raw["Id"])
            raise RuntimeFailure(
                f"the engine at {self.url} dropped the devices {', '.join(dropped)} of AMD GPUs {', '.join(plan.amd)}: "
                f"{AMD_GPU_FIX}"
            )

    async def _pull(self, image: str, auth: RegistryAuth | None, on_progress: PullProgressCallback | None) -> None:
        """``POST /images/create``, reading its JSON-lines stream as it comes: progress for the renter, the engine's
        error (sent inside a 200 stream), and a stop as soon as the layers announced pass the largest image allowed."""
        prefix = await self._negotiate()
        headers = {"X-Registry-Auth": auth_header(auth, image)} if auth is not None else {}
        progress, errors = PullProgress(), []
        timeout = aiohttp.ClientTimeout(total=self.images.pull_timeout_s, sock_connect=self.timeout_s)
        try:
            async with self._open().post(
                f"http://docker{prefix}/images/create", params=pull_query(image), headers=headers, timeout=timeout
            ) as response:
                if response.status != 200:
                    raise pull_failure(image, _message(_decode(await response.read())), self.url)
                async for line in response.content:
                    event = _decode(line)
                    if not isinstance(event, dict):
                        continue
                    if event.get("error"):
                        errors.append(str(event["error"]))
                        continue
                    progress.feed(event)
                    if self.images.max_image_bytes and progress.total_bytes > self.images.max_image_bytes:
                        raise too_large(image, progress.total_bytes, self.images)  # leaving closes: the pull stops
                    if on_progress is not None:
                        on_progress(progress)
        except TimeoutError as exc:
            raise ImagePullTimeout(
                f"pulling image {image!r} took longer than this host's pull timeout ({self.images.pull_timeout_s:.0f} s,"
                f" {progress.text()} done); use a smaller image or a faster registry"
            ) from exc
        except aiohttp.ClientError as exc:
            raise RuntimeFailure(f"pulling image {image!r} through {self.url} failed: {_reason(exc)}") from exc
        if errors:
            raise pull_failure(image, errors[-1], self.url)

    async def ensure_image(self, spec: ContainerSpec, on_progress: PullProgressCallback | None = None) -> None:
        """Pull ``spec.image`` unless the engine has it and this create may use it, within this host's limits, then
        evict unused pulled images past the disk budget. An image pulled with another renter's credentials is pulled
        again with this create's own (``ImageAccess``): the registry, not the host's cache, decides who runs it.
        Raises a ``RenterFault`` when the renter's image or credentials are why it failed."""
        found = await self._image(spec.image)
        if found is not None and self._admits(found["Id"], spec):
            self.image_uses.touch(found["Id"], time.time())
            return
        if not self.images.pull:
            raise _not_pulled(spec.image, private=found is not None)
        if found is not None and _names_by_id(spec.image, found["Id"]):
            raise ImageUnauthorized(
                f"image {spec.image!r} is private and another renter's credentials pulled it: name it by its registry "
                "reference, with your credentials (registry_auth), so the registry can check them"
            )
        check_registry(spec.image, self.images)
        await check_registry_egress(self.images.egress, spec.image)  # the registry's addresses public, or allowed
        await self._pull(spec.image, spec.registry_auth, on_progress)
        pulled = await self._image(spec.image)
        if pulled is None:
            raise RuntimeFailure(f"image {spec.image!r} was pulled through {self.url} but the engine does not list it")
        size = int(pulled.get("Size") or 0)
        if self.images.max_image_bytes and size > self.images.max_image_bytes:
            await self._call("DELETE", f"/images/{pulled['Id']}", params={"force": "false"})
            raise too_large(spec.image, size, self.images)
        self.image_access.pulled(pulled["Id"], registry_of(spec.image), spec.registry_auth)
        self.image_uses.touch(pulled["Id"], time.time(), pulled=True)
        await self.evict(keep=pulled["Id"])  # not the image just pulled: its container is about to be made

    def _admits(self, image_id: str, spec: ContainerSpec) -> bool:
        return self.image_access.admits(image_id, registry_of(spec.image), spec.registry_auth)

    async def evict(self, *, keep: str = "") -> builtins.list[str]:
        """Remove the images the agent pulled that no container uses, least recently used first, until the pulled
        ones fit the disk budget; returns the removed ids. An image the engine refuses to remove (a container made
        from it meanwhile) is kept."""
        if self.images.disk_budget_bytes <= 0:
            return []
        stored = await self._stored_images()
        removed = []
        candidates = [image if image.id != keep else dataclasses.replace(image, in_use=True) for image in stored]
        for image in evictions(candidates, self.image_uses.uses, self.images.disk_budget_bytes):
            status, _ = await self._call("DELETE", f"/images/{image.id}", params={"force": "false"})
            if status in (200, 404):
                removed.append(image.id)
        gone = {image.id for image in stored}
        self.image_uses.forget([*removed, *(i for i in self.image_uses.uses if i not in gone)])
        self.image_access.keep_only(image_id for image_id in gone if image_id not in removed)
        return removed

    async def image_references(self, limit: int) -> builtins.list[str]:
        """The images this host has, as references renters name, the most recently used or made first (hello): the
        public ones only. An image pulled with a renter's credentials is that renter's to know of: never listed."""
        status, body = await self._call("GET", "/images/json")
        if status != 200 or not isinstance(body, builtins.list):
            raise _failure("listing images", status, body)
        self.image_access.keep_only(entry.get("Id", "") for entry in body)
        uses = self.image_uses.uses
        return warm_first(
            (
                (ref, max(uses.get(entry.get("Id", ""), 0.0), float(entry.get("Created") or 0)))
                for entry in body
                if not self.image_access.private(entry.get("Id", ""))
                for ref in entry.get("RepoTags") or []
            ),
            limit,
        )

    async def _stored_images(self) -> builtins.list[StoredImage]:
        status, body = await self._call("GET", "/images/json")
        if status != 200 or not isinstance(body, builtins.list):
            raise _failure("listing images", status, body)
        status, containers = await self._call("GET", "/containers/json", params={"all": "true"})
        if status != 200 or not isinstance(containers, builtins.list):
            raise _failure("listing containers", status, containers)
        used = {c.get("ImageID") for c in containers} | {c.get("Image") for c in containers}
        return [
            StoredImage(
                id=entry["Id"],
                size=int(entry.get("Size") or 0),
                in_use=entry["Id"] in used or bool(set(entry.get("RepoTags") or []) & used),
                references=tuple(entry.get("RepoTags") or ()),
            )
            for entry in body
        ]

    async def _image(self, reference: str) -> dict[str, Any] | None:
        status, body = await self._call("GET", f"/images/{quote(reference, safe='/:@')}/json")
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise _failure(f"inspecting image {reference!r}", status, body)
        return body

    async def _remove_quietly(self, cid: str) -> None:
        await self._call("DELETE", f"/containers/{cid}", params={"force": "true", "v": "true"})

    async def put_file(self, name: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` at ``path`` inside container ``name`` (its directory must exist): the engine's archive
        upload, a tar of one file. RuntimeFailure when the engine refuses."""
        directory, _, filename = path.rpartition("/")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(filename)
            member.size, member.mode, member.mtime = len(data), mode, int(time.time())
            tar.addfile(member, io.BytesIO(data))
        status, body = await self._call(
            "PUT",
            f"/containers/{quote(name, safe='')}/archive",
            params={"path": directory or "/"},
            data=buffer.getvalue(),
            content_type="application/x-tar",
        )
        if status != 200:
            raise _failure(f"writing {path} into container {name!r}", status, body)

    async def network_namespace(self, name: str) -> str | None:
        """The path of a running container's network namespace (a gang's overlay runs in it, docs/overlay.md); None
        when it does not run, or the engine's processes are not this agent's to see (a rootless engine, another
        PID namespace)."""
        raw = await self._inspect_raw(name)
        pid = int(((raw or {}).get("State") or {}).get("Pid") or 0)
        path = f"/proc/{pid}/ns/net"
        return path if pid > 0 and os.path.exists(path) else None

    async def _inspect_raw(self, name: str) -> dict[str, Any] | None:
        status, body = await self._call("GET", f"/containers/{quote(name, safe='')}/json")
        for pause in INSPECT_RACE_PAUSES_S:
            if not _exit_race(status, body):
                break
            # Podman read the cgroup of a process that had just ended (the container exiting as it was inspected):
            # asked again a moment later, it describes the container as exited.
            await asyncio.sleep(pause)
            status, body = await self._call("GET", f"/containers/{quote(name, safe='')}/json")
        if status == 404:
            return None
        if status != 200:
            raise _failure(f"inspecting container {name!r}", status, body)
        # Engines also match an id prefix; only a container *named* so is the one asked for.
        return body if body.get("Name", "").lstrip("/") == name else None

    async def _inspect_required(self, name: str) -> dict[str, Any]:
        raw = await self._inspect_raw(name)
        if raw is None:
            raise RuntimeFailure(f"container {name!r} vanished from {self.url} right after it was created")
        return raw

    async def _existing(self, name: str) -> dict[str, Any]:
        raw = await self._inspect_raw(name)
        if raw is None:
            raise RuntimeFailure(f"no container named {name!r} on this host ({self.url})")
        return raw

    async def _running(self, name: str) -> dict[str, Any]:
        raw = await self._existing(name)
        info = _info(raw)
        if info.state != "running":
            ended = f", exit code {info.exit_code}" if info.exit_code is not None else ""
            raise RuntimeFailure(f"container {name!r} is not running (it is {info.state}{ended})")
        return raw

    async def _list(self, label_filter: str) -> builtins.list[ContainerInfo]:
        filters = json.dumps({"label": [label_filter]})
        status, body = await self._call("GET", "/containers/json", params={"all": "true", "filters": filters})
        if status != 200:
            raise _failure("listing containers", status, body)
        return [_summary_info(entry) for entry in body]

    # --- HTTP -------------------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        timeout_s: float | None = None,
        versioned: bool = True,
        data: bytes | None = None,
        content_type: str = "",
    ) -> tuple[int, Any]:
        prefix = await self._negotiate() if versioned else ""
        limit = timeout_s or self.timeout_s
        try:
            async with self._open().request(
                method,
                f"http://docker{prefix}{path}",
                params=params,
                json=body if data is None else None,
                data=data,
                headers={"Content-Type": content_type} if content_type else None,
                timeout=aiohttp.ClientTimeout(total=limit),
            ) as response:
                return response.status, _decode(await response.read())
        except TimeoutError as exc:
            raise RuntimeFailure(f"the Docker API at {self.url} did not answer {method} {path} within {limit:.0f} s") from exc
        except aiohttp.ClientError as exc:
            raise RuntimeFailure(f"cannot reach the Docker API at {self.url}: {_reason(exc)}") from exc

    async def _negotiate(self) -> str:
        """Speak the engine's own API version (as the docker CLI does), refusing engines too old for GPUs."""
        if self._api_prefix is None:
            status, info = await self._call("GET", "/version", versioned=False)
            version = str(info.get("ApiVersion", "")) if status == 200 and isinstance(info, dict) else ""
            if not version:
                raise _failure("asking the engine for its API version", status, info)
            if _version_tuple(version) < MIN_API_VERSION:
                minimum = ".".join(map(str, MIN_API_VERSION))
                raise RuntimeFailure(f"the engine at {self.url} speaks Docker API {version}; idlegrid needs {minimum} or newer")
            self._libpod_version = _podman_version(info)
            self._api_prefix = f"/v{version}"
        return self._api_prefix

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that will use it.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket_path))
        return self._session


def create_body(
    spec: ContainerSpec,
    labels: Mapping[str, str],
    capabilities: Sequence[str],
    *,
    device_requests: bool = True,
    mounts: Sequence[Mount] = (),
    network: str = "",
    gpus: GpuPlan | None = None,
    groups: Sequence[int] = (),
) -> dict[str, Any]:
    """The ``POST /containers/create`` body for ``spec``: limits, hardening and its GPUs (``gpus``: the plan of
    agent/runtime/gpu_access.py; every GPU NVIDIA's without one): with ``device_requests``, an NVIDIA device request
    and AMD's device files with the ``groups`` that own them; without, the GPUs by name only (simulated ones);
    ``network``: its network mode ("" the engine's default)."""
    plan = gpus if gpus is not None else GpuPlan(nvidia=tuple(spec.gpus))
    host: dict[str, Any] = {
        "Privileged": False,
        "CapDrop": ["ALL"],
        "CapAdd": list(capabilities),
        "SecurityOpt": ["no-new-privileges"],  # setuid binaries in an image cannot raise privileges
    }
    if spec.cpus is not None:
        host["NanoCpus"] = round(spec.cpus * 1e9)
    if spec.memory_mib is not None:
        host["Memory"] = spec.memory_mib * MIB
        host["MemorySwap"] = spec.memory_mib * MIB  # equal: no swap beyond the memory that was sold
    if mounts:
        host["Binds"] = [f"{m.host}:{m.container}:{'rw' if m.writable else 'ro'}" for m in mounts]
    if network:
        host["NetworkMode"] = network
    if plan.nvidia and device_requests:
        host["DeviceRequests"] = [{"Driver": "nvidia", "DeviceIDs": list(plan.nvidia), "Capabilities": [["gpu"]]}]
    if plan.devices and device_requests:
        host["Devices"] = [
            {"PathOnHost": node.host, "PathInContainer": node.container, "CgroupPermissions": "rwm"} for node in plan.devices
        ]
        if groups:
            host["GroupAdd"] = [str(gid) for gid in groups]
    named = plan.visible_env() if spec.gpus and not device_requests else {}
    body: dict[str, Any] = {
        "Image": spec.image,
        "Env": [f"{key}={value}" for key, value in spec.env.items() if key != ENV_CONTAINER and key not in named]
        + [f"{ENV_CONTAINER}={spec.name}"]
        + [f"{key}={value}" for key, value in named.items()],
        "Labels": dict(labels),
        "HostConfig": host,
    }
    if spec.command:
        body["Cmd"] = list(spec.command)  # otherwise the image's own CMD runs
    return body


def libpod_create_body(
    spec: ContainerSpec,
    labels: Mapping[str, str],
    capabilities: Sequence[str],
    mounts: Sequence[Mount] = (),
    *,
    network: str = "",
    gpus: GpuPlan | None = None,
    groups: Sequence[int] = (),
) -> dict[str, Any]:
    """Podman's own ``POST /libpod/containers/create`` body (its SpecGenerator) for ``spec``: the limits and hardening
    of ``create_body``, each NVIDIA GPU as the CDI device ``nvidia.com/gpu=<uuid>`` and each AMD card's device files
    (``host:container:rwm``, Podman's --device form) with the ``groups`` that own them."""
    plan = gpus if gpus is not None else GpuPlan(nvidia=tuple(spec.gpus))
    body: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        "env": dict(spec.env),
        "labels": dict(labels),
        "privileged": False,
        "cap_drop": ["ALL"],
        "cap_add": list(capabilities),
        "no_new_privileges": True,
        "devices": [{"path": f"{CDI_GPU_KIND}={gpu}"} for gpu in plan.nvidia]
        + [{"path": f"{node.host}:{node.container}:rwm"} for node in plan.devices],
    }
    if groups and plan.devices:
        body["groups"] = [str(gid) for gid in groups]
    if network:
        body["netns"] = {"nsmode": network}
    if mounts:
        body["mounts"] = [
            {
                "type": "bind",
                "source": str(m.host),
                "destination": m.container,
                "options": ["rbind", "rw" if m.writable else "ro"],
            }
            for m in mounts
        ]
    limits: dict[str, Any] = {}
    if spec.cpus is not None:
        limits["cpu"] = {"quota": round(spec.cpus * CPU_PERIOD_US), "period": CPU_PERIOD_US}
    if spec.memory_mib is not None:
        limits["memory"] = {"limit": spec.memory_mib * MIB, "swap": spec.memory_mib * MIB}
    if limits:
        body["resource_limits"] = limits
    if spec.command:
        body["command"] = list(spec.command)
    return body


def _podman_version(version: Mapping[str, Any]) -> str | None:
    """Podman's own API version from ``/version`` (its Components name it), or None for Docker."""
    for component in version.get("Components") or []:
        if isinstance(component, dict) and component.get("Name") == PODMAN_ENGINE:
            details = component.get("Details") or {}
            return str(details.get("APIVersion") or component.get("Version") or "") or None
    return None


def _not_pulled(reference: str, *, private: bool) -> RuntimeFailure:
    """Why a host that does not pull cannot run ``reference``: not here, or here but pulled with other credentials."""
    if private:
        return ImageUnauthorized(
            f"image {reference!r} is private and another renter's credentials pulled it; this host does not pull "
            "images, so it cannot check yours: choose a host that pulls"
        )
    return ImageNotFound(
        f"image not found: {reference!r} is not on this host, which does not pull images "
        "(its provider loads them by hand); choose a host that has it"
    )


def _names_by_id(reference: str, image_id: str) -> bool:
    """Whether ``reference`` is ``image_id`` or a prefix of it (engines find an image so): nothing a registry can check."""
    named = reference.removeprefix("sha256:")
    return len(named) >= 1 and image_id.removeprefix("sha256:").startswith(named)


def _image_missing(status: int, body: Any) -> bool:
    # Docker's API answers 404; Podman's own API answers 404 too, or 500 naming the image it could not find.
    return status == 404 or (status == 500 and "image not known" in _message(body))


# Podman's Docker API may say "stopped" for a container whose process has exited (before its clean-up ran): the
# Docker name for that is "exited", which the agent's exit reports and the self-test wait for.
_ENDED_ALIASES = {"stopped": "exited"}


def _info(raw: Mapping[str, Any]) -> ContainerInfo:
    state = raw.get("State") or {}
    status = state.get("Status", "unknown")
    status = _ENDED_ALIASES.get(status, status)
    return ContainerInfo(
        id=raw["Id"],
        name=raw.get("Name", "").lstrip("/"),
        runtime=DockerRuntime.name,
        state=status,
        labels=(raw.get("Config") or {}).get("Labels") or {},
        exit_code=state.get("ExitCode") if status in ("exited", "dead") else None,
    )


def _summary_info(entry: Mapping[str, Any]) -> ContainerInfo:
    """From a ``/containers/json`` entry, which gives the exit code only inside its Status text."""
    status = entry.get("State", "unknown")
    status = _ENDED_ALIASES.get(status, status)
    names = entry.get("Names") or [""]
    return ContainerInfo(
        id=entry["Id"],
        name=names[0].lstrip("/"),
        runtime=DockerRuntime.name,
        state=status,
        labels=entry.get("Labels") or {},
        exit_code=_exit_code_from_status(entry.get("Status", "")) if status in ("exited", "dead") else None,
    )


def _addresses(raw: Mapping[str, Any]) -> builtins.list[str]:
    """The container's IP addresses on the engine's networks (none with ``--network none`` or host networking)."""
    settings = raw.get("NetworkSettings") or {}
    found = [settings.get("IPAddress") or ""]
    found += [network.get("IPAddress") or "" for network in (settings.get("Networks") or {}).values()]
    return builtins.list(dict.fromkeys(address for address in found if address))


def _exit_code_from_status(text: str) -> int | None:
    # "Exited (137) 5 seconds ago"
    head, _, rest = text.partition("(")
    code = rest.partition(")")[0]
    return int(code) if head.strip() == "Exited" and code.lstrip("-").isdigit() else None


def _decode(payload: bytes) -> Any:
    text = payload.decode("utf-8", "replace")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body.get("cause") or body)
    return str(body or "no details").strip()


def _failure(what: str, status: int, body: Any) -> RuntimeFailure:
    return RuntimeFailure(f"{what} failed: the engine answered {status}: {_message(body)}")


def _exit_race(status: int, body: Any) -> bool:
    """Podman's answer to an inspect that raced the container's exit ("read /proc/N/cgroup: no such process")."""
    return status == 500 and "no such process" in _message(body).lower()


def _name_in_use(status: int, body: Any) -> bool:
    # Docker answers 409; Podman's compatible API answers 500 with "already in use".
    return status == 409 or (status == 500 and "already in use" in _message(body))


def _stream_error(line: str) -> str | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event.get("error") if isinstance(event, dict) else None


def _reason(exc: aiohttp.ClientError) -> str:
    os_error = getattr(exc, "os_error", None)  # ClientConnectorError: the socket's own errno text is what helps
    if isinstance(os_error, OSError) and os_error.strerror:
        return os_error.strerror
    return str(exc) or type(exc).__name__


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return (0,)
