"""What the agent asks of a container runtime, whichever engine (or none) runs the containers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from common.containers import LABEL_COMMAND_ID, LABEL_NAME, ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure

# The state a runtime reports for a container that ``delete`` has just removed.
STATE_REMOVED = "removed"


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
