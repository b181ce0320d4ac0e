"""Containers through the Docker Engine API on its unix socket; Podman's Docker-compatible service works too.

Plain HTTP through aiohttp rather than the docker SDK: the agent needs a few endpoints, and one HTTP stack.
A renter's exec takes over its connection, which aiohttp cannot do: see docker_exec.py.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from agent.runtime.base import STATE_REMOVED, STDOUT, ExecSession, check_same_command, container_labels
from agent.runtime.docker_exec import DockerExecSession, exec_streams, hijack, read_frame
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure

DEFAULT_SOCKET = "/var/run/docker.sock"
MIB = 1024 * 1024
# DeviceRequests (how the NVIDIA Container Toolkit is asked for GPUs) arrived in API 1.40 (Docker 19.03).
MIN_API_VERSION = (1, 40)

# Every capability is dropped, then these are given back: what images that start as root need to install
# packages and step down to a user (apt, chown of a data dir, gosu/su). Left out of Docker's defaults:
# NET_RAW (forged packets on the provider's network), MKNOD, SETFCAP, SETPCAP, SYS_CHROOT, AUDIT_WRITE.
# Dropping ALL first means a newer engine's defaults can never widen what a renter gets.
CONNECT_TIMEOUT_S = 3.0  # to a container's address on the engine's network, before trying through exec
DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID")


class DockerRuntime:
    """A ``ContainerRuntime`` on a Docker-API engine. Images must already be on the host unless pulling is allowed."""

    name = "docker"
    isolation = "container"

    def __init__(
        self,
        socket: str | Path = DEFAULT_SOCKET,
        *,
        allow_pull: bool = False,
        timeout_s: float = 60.0,
        pull_timeout_s: float = 1800.0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
        simulated_gpus: bool = False,
    ) -> None:
        """``simulated_gpus``: the host's GPUs are the agent's simulation (``--simulate``), so a container is given
        them by name (``CUDA_VISIBLE_DEVICES``) and no device is asked of the engine: there is none to give."""
        self.socket_path = str(socket)
        self.simulated_gpus = simulated_gpus
        self.allow_pull = allow_pull
        self.timeout_s = timeout_s
        self.pull_timeout_s = pull_timeout_s
        self.capabilities = tuple(capabilities)
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

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        wanted = container_labels(spec, labels)
        raw = await self._inspect_raw(spec.name) or await self._create(spec, wanted)
        info = check_same_command(_info(raw), wanted)
        if info.state != "created":
            return info  # running or already finished: a repeat delivery, not a second run
        # Ours and never started (a fresh create, or an agent that died between create and start).
        if not self.simulated_gpus:
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

    async def _create(self, spec: ContainerSpec, labels: dict[str, str]) -> dict[str, Any]:
        body = create_body(spec, labels, self.capabilities, device_requests=not self.simulated_gpus)
        status, reply = await self._call("POST", "/containers/create", params={"name": spec.name}, body=body)
        if status == 404 and self.allow_pull:
            await self._pull(spec.image)
            status, reply = await self._call("POST", "/containers/create", params={"name": spec.name}, body=body)
        if status == 404:
            raise RuntimeFailure(
                f"image {spec.image!r} not found locally on this host; no registry pull "
                "(load it with `docker load` or `podman import`, or allow pulling in the agent's settings)"
            )
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
        raise _failure(f"starting container {info.name!r}", status, body)

    async def _require_gpus(self, spec: ContainerSpec, raw: dict[str, Any]) -> None:
        """A renter paying for GPUs must not get a container without them, so check what the engine kept."""
        granted = {gpu for request in raw["HostConfig"].get("DeviceRequests") or [] for gpu in request.get("DeviceIDs") or []}
        if set(spec.gpus) <= granted:
            return
        await self._remove_quietly(raw["Id"])
        raise RuntimeFailure(
            f"the engine at {self.url} dropped the request for GPUs {', '.join(spec.gpus)}; GPU containers need "
            "Docker with the NVIDIA Container Toolkit (Podman's Docker API ignores DeviceRequests)"
        )

    async def _pull(self, image: str) -> None:
        status, body = await self._call("POST", "/images/create", params={"fromImage": image}, timeout_s=self.pull_timeout_s)
        # The engine streams progress as JSON lines and reports a failed pull inside a 200 stream.
        lines = body.splitlines() if isinstance(body, str) else [json.dumps(body)]
        errors = [msg for msg in map(_stream_error, lines) if msg]
        if status != 200 or errors:
            reason = errors[-1] if errors else _message(body)
            raise RuntimeFailure(f"pulling image {image!r} through {self.url} failed: {reason}")

    async def _remove_quietly(self, cid: str) -> None:
        await self._call("DELETE", f"/containers/{cid}", params={"force": "true", "v": "true"})

    async def _inspect_raw(self, name: str) -> dict[str, Any] | None:
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
    ) -> tuple[int, Any]:
        prefix = await self._negotiate() if versioned else ""
        limit = timeout_s or self.timeout_s
        try:
            async with self._open().request(
                method,
                f"http://docker{prefix}{path}",
                params=params,
                json=body,
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
            self._api_prefix = f"/v{version}"
        return self._api_prefix

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that will use it.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket_path))
        return self._session


def create_body(
    spec: ContainerSpec, labels: Mapping[str, str], capabilities: Sequence[str], *, device_requests: bool = True
) -> dict[str, Any]:
    """The ``POST /containers/create`` body for ``spec``: limits, hardening and (for GPUs) an NVIDIA device request."""
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
    if spec.gpus and device_requests:
        host["DeviceRequests"] = [{"Driver": "nvidia", "DeviceIDs": list(spec.gpus), "Capabilities": [["gpu"]]}]
    body: dict[str, Any] = {
        "Image": spec.image,
        "Env": [f"{key}={value}" for key, value in spec.env.items()]
        + ([f"CUDA_VISIBLE_DEVICES={','.join(spec.gpus)}"] if spec.gpus and not device_requests else []),
        "Labels": dict(labels),
        "HostConfig": host,
    }
    if spec.command:
        body["Cmd"] = list(spec.command)  # otherwise the image's own CMD runs
    return body


def _info(raw: Mapping[str, Any]) -> ContainerInfo:
    state = raw.get("State") or {}
    status = state.get("Status", "unknown")
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
