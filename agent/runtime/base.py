"""What the agent asks of a container runtime, whichever engine (or none) runs the containers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.runtime.images import PullProgress
from common.containers import LABEL_COMMAND_ID, LABEL_NAME, ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure

# The state a runtime reports for a container that ``delete`` has just removed.
STATE_REMOVED = "removed"
# Every container's own name on its host (its workload, replica and attempt: ``wl-...-r0-a1``), in its environment
# whatever the runtime, so a program can name what it writes (Docker's HOSTNAME is an id, the working directory a path).
ENV_CONTAINER = "IDLEGRID_CONTAINER"
STDOUT = 1  # the channel numbers of output (common.tunnel.Op.DATA and Op.STDERR carry them)
STDERR = 2


class ExecSession(Protocol):
    """A command running in a container for a renter (``ContainerRuntime.exec``): its output, its input, its end."""

    async def read(self) -> tuple[int, bytes] | None:
        """The next output, ``(STDOUT or STDERR, bytes)`` (always STDOUT with a tty); ``None`` once it has ended."""
        ...

    async def write(self, data: bytes) -> None:
        """Feed the command's standard input."""
        ...

    async def close_stdin(self) -> None:
        """End of input (the command reads EOF); its output goes on."""
        ...

    async def resize(self, cols: int, rows: int) -> None:
        """Change the terminal's size (with a tty; a no-op otherwise)."""
        ...

    async def wait(self) -> int:
        """The command's exit status, once it has ended (128 + N when killed by signal N)."""
        ...

    async def close(self) -> None:
        """Stop it if it still runs (the renter went away) and free what it holds."""
        ...


class ContainerRuntime(Protocol):
    """Creates, inspects and removes the containers that the Master's commands ask for.

    Every method raises ``RuntimeFailure`` with a message a provider can act on.
    """

    name: str  # one of common.inventory.RUNTIMES, reported in hello
    isolation: str  # one of common.inventory.ISOLATIONS: how well a container is kept from the host

    async def probe(self) -> None:
        """Raise ``RuntimeFailure`` saying why, when this runtime cannot run containers now (no engine reachable)."""
        ...

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        """Start ``spec``; if a container of that name exists with the same command id, return it instead."""
        ...

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        """Stop (SIGTERM, then SIGKILL after ``timeout_s``) and remove; ``None`` if there was no such container."""
        ...

    async def inspect(self, name: str) -> ContainerInfo | None: ...

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        """Containers carrying that label; how a restarted agent learns whether a command already ran."""
        ...

    async def list(self) -> list[ContainerInfo]:
        """Only the containers idlegrid created: those labelled with a command id."""
        ...

    async def close(self) -> None: ...

    # --- renter access (common/tunnel.py): each raises RuntimeFailure when the container does not run here

    def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        """The container's output as ``(STDOUT or STDERR, bytes)``: the last ``tail`` lines (-1: all), then, when
        ``follow``, what it writes until it ends."""
        ...

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        """Start ``command`` inside the running container ``name`` (its filesystem, environment, user and limits)."""
        ...

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to ``port`` of the running container ``name``, as seen from inside it."""
        ...


@dataclass(frozen=True)
class Mount:
    """A host directory a container gets at ``container`` (read-only unless ``writable``): agent/storage/."""

    host: Path
    container: str
    writable: bool


@runtime_checkable
class MountsData(Protocol):
    """A runtime that can give a container host directories (agent/storage/: inputs, outputs, the checkpoint).
    ``host_paths``: the container sees them at their host paths (no mount namespace of its own to bind them in).
    A runtime may also have ``data_root``: the directory under which it binds the spec's paths (process: /idlegrid)."""

    host_paths: bool

    async def create_mounted(
        self, spec: ContainerSpec, *, labels: Mapping[str, str], mounts: Sequence[Mount]
    ) -> ContainerInfo: ...


@runtime_checkable
class PullsImages(Protocol):
    """A runtime that fetches a container's image itself (docker): the executor has it done before it takes its
    placing lock, so a long pull never holds up other commands, and passes the pull's progress on."""

    async def ensure_image(self, spec: ContainerSpec, on_progress: Callable[[PullProgress], None] | None = None) -> None: ...

    async def image_references(self, limit: int) -> list[str]: ...


def container_labels(spec: ContainerSpec, labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a container gets: the renter's (ContainerSpec refuses reserved keys), then the agent's, then its name."""
    merged = {**spec.labels, **labels}
    merged[LABEL_NAME] = spec.name
    return merged


def check_same_command(existing: ContainerInfo, labels: Mapping[str, str]) -> ContainerInfo:
    """Creating twice under one command id is a repeat delivery; under another id it is a name clash."""
    ours, theirs = labels.get(LABEL_COMMAND_ID), existing.labels.get(LABEL_COMMAND_ID)
    if ours != theirs:
        owner = f"by command {theirs}" if theirs else "outside idlegrid"
        raise RuntimeFailure(
            f"a container named {existing.name!r} already exists on this host (created {owner}); "
            "delete it first or choose another name"
        )
    return existing
