"""A container runtime that runs nothing: for the fleet simulator, benchmarks and tests.

It answers like a real engine (same checks, same ``ContainerInfo``), after a configurable latency and
with a configurable share of failures, and it keeps an append-only journal of every create and delete
it carried out, so a test can check that each command id ran exactly once.
"""

from __future__ import annotations

import asyncio
import asyncio as _asyncio_stub  # noqa: F401
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from agent.runtime.base import STATE_REMOVED, ExecSession, check_same_command, container_labels
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure


@dataclass(frozen=True, slots=True)
class Execution:
    """One operation the runtime carried out (a failed one is journalled too, with ``ok=False``)."""

    op: str  # "create" | "delete"
    name: str
    command_id: str  # of the create; empty for a delete, which names a container, not a command
    ok: bool


class SimulatedRuntime:
    """A ``ContainerRuntime`` keeping containers in memory; each create or delete waits ``latency_s`` (± jitter)
    and then fails with probability ``failure_rate``."""

    name = "simulated"
    # It stands in for an engine host in the fleet simulator and benchmarks, so the Master treats it like one.
    isolation = "container"

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        failure_rate: float = 0.0,
        seed: int | None = None,
        journal: list[Execution] | None = None,
    ) -> None:
        """``journal``: a list to append to, which several runtimes (a fleet's) may share."""
        if latency_s < 0 or jitter_s < 0:
            raise ValueError(f"latency_s and jitter_s must not be negative, got {latency_s} and {jitter_s}")
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError(f"failure_rate must be between 0 and 1, got {failure_rate}")
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.failure_rate = failure_rate
        self._rng = random.Random(seed)
        self._containers: dict[str, ContainerInfo] = {}
        self.journal: list[Execution] = journal if journal is not None else []

    async def probe(self) -> None:
        """Always ready: it runs nothing."""

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        merged = container_labels(spec, labels)
        existing = self._containers.get(spec.name)
        if existing is not None:
            return check_same_command(existing, merged)
        command_id = merged.get(LABEL_COMMAND_ID, "")
        await self._work("create", spec.name, command_id)
        info = ContainerInfo(id=uuid.uuid4().hex[:12], name=spec.name, runtime=self.name, state="running", labels=merged)
        self._containers[spec.name] = info
        return info

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        existing = self._containers.get(name)
        if existing is None:
            return None
        await self._work("delete", name, "")
        del self._containers[name]
        return ContainerInfo(id=existing.id, name=name, runtime=self.name, state=STATE_REMOVED, labels=existing.labels)

    async def inspect(self, name: str) -> ContainerInfo | None:
        return self._containers.get(name)

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return [c for c in self._containers.values() if c.labels.get(label_key) == label_value]

    async def list(self) -> list[ContainerInfo]:
        return [c for c in self._containers.values() if LABEL_COMMAND_ID in c.labels]

    # Renter access: contract stubs, replaced by the runtime's real logs/exec/connect.
    def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        raise RuntimeFailure(f"the {self.name} runtime cannot show logs yet")

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        raise RuntimeFailure(f"the {self.name} runtime cannot exec yet")

    async def connect(self, name: str, port: int) -> tuple[_asyncio_stub.StreamReader, _asyncio_stub.StreamWriter]:
        raise RuntimeFailure(f"the {self.name} runtime cannot connect to a container's port yet")

    async def close(self) -> None:
        """Nothing to release: the containers are only entries in memory."""

    def finish(self, name: str, code: int) -> None:
        """The container ``name`` ends on its own with exit status ``code``, as a real one would (tests, the fleet
        simulator): it stays, ``exited``, until deleted."""
        existing = self._containers.get(name)
        if existing is None:
            raise RuntimeFailure(f"no simulated container {name!r} to finish")
        self._containers[name] = msgspec.structs.replace(existing, state="exited", exit_code=code)

    def executions(self) -> Counter[str]:
        """How many times each command id's create was carried out; more than once breaks at-most-once."""
        return Counter(e.command_id for e in self.journal if e.op == "create" and e.command_id)

    async def _work(self, op: str, name: str, command_id: str) -> None:
        delay = self.latency_s + (self._rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        ok = self._rng.random() >= self.failure_rate
        self.journal.append(Execution(op, name, command_id, ok))
        if not ok:
            raise RuntimeFailure(f"simulated {op} failure for container {name!r} (failure rate {self.failure_rate:g})")
