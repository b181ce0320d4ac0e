"""A container runtime that runs nothing: for the fleet simulator, benchmarks and tests.

It answers like a real engine (same checks, same ``ContainerInfo``), after a configurable latency and
with a configurable share of failures, and it keeps an append-only journal of every create and delete
it carried out, so a test can check that each command id ran exactly once.

Renter access is simulated as well: logs are a few fixed lines naming the container (and a line a second while
followed), exec echoes its input (``SimulatedExecSession``), and a simulated container has no ports to connect to.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from agent.runtime.base import STATE_REMOVED, STDOUT, ExecSession, check_same_command, container_labels
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
        log_interval_s: float = 1.0,
    ) -> None:
        """``journal``: a list to append to, which several runtimes (a fleet's) may share. ``log_interval_s``: how
        often a followed log gets a line."""
        if latency_s < 0 or jitter_s < 0:
            raise ValueError(f"latency_s and jitter_s must not be negative, got {latency_s} and {jitter_s}")
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError(f"failure_rate must be between 0 and 1, got {failure_rate}")
        if log_interval_s <= 0:
            raise ValueError(f"log_interval_s must be positive, got {log_interval_s}")
        self.latency_s = latency_s
        self.log_interval_s = log_interval_s
        self.jitter_s = jitter_s
        self.failure_rate = failure_rate
        self._rng = random.Random(seed)
        self._containers: dict[str, ContainerInfo] = {}
        # A followed log's wake-up when its container ends (by container id): a real engine closes the stream at the
        # container's exit, so a follower must not sleep on to its next line (the output keeper waits for that end).
        self._ended: dict[str, asyncio.Event] = {}
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
        self._wake_followers(existing.id)
        return ContainerInfo(id=existing.id, name=name, runtime=self.name, state=STATE_REMOVED, labels=existing.labels)

    async def inspect(self, name: str) -> ContainerInfo | None:
        return self._containers.get(name)

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return [c for c in self._containers.values() if c.labels.get(label_key) == label_value]

    async def list(self) -> list[ContainerInfo]:
        return [c for c in self._containers.values() if LABEL_COMMAND_ID in c.labels]

    # --- renter access: simulated too ------------------------------------------------------------------

    async def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        """A few fixed lines naming the container, then, when following, one line every ``log_interval_s`` while it
        runs (until it is deleted or finishes)."""
        container = self._require(name)
        lines = _simulated_log(container)
        for line in lines[len(lines) - tail if 0 <= tail < len(lines) else 0 :]:
            yield STDOUT, line
        tick = 0
        while follow and self._still_running(container):
            ended = self._ended.setdefault(container.id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), self.log_interval_s)
            if not self._still_running(container):
                return
            tick += 1
            yield STDOUT, f"[{name}] simulated output line {tick}\n".encode()

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        """A ``SimulatedExecSession``: nothing runs; whatever is written comes back."""
        container = self._require(name)
        if container.state != "running":
            raise RuntimeFailure(f"container {name!r} is not running (it is {container.state})")
        return SimulatedExecSession(list(command), tty=tty, cols=cols, rows=rows)

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._require(name)
        raise RuntimeFailure(f"a simulated container has no ports (container {name!r}, port {port})")

    async def close(self) -> None:
        """Nothing to release: the containers are only entries in memory."""

    def finish(self, name: str, code: int) -> None:
        """The container ``name`` ends on its own with exit status ``code``, as a real one would (tests, the fleet
        simulator): it stays, ``exited``, until deleted."""
        existing = self._containers.get(name)
        if existing is None:
            raise RuntimeFailure(f"no simulated container {name!r} to finish")
        self._containers[name] = msgspec.structs.replace(existing, state="exited", exit_code=code)
        self._wake_followers(existing.id)

    def _wake_followers(self, container_id: str) -> None:
        ended = self._ended.pop(container_id, None)
        if ended is not None:
            ended.set()

    def _require(self, name: str) -> ContainerInfo:
        container = self._containers.get(name)
        if container is None:
            raise RuntimeFailure(f"no container named {name!r} on this host (simulated runtime)")
        return container

    def _still_running(self, container: ContainerInfo) -> bool:
        now = self._containers.get(container.name)
        return now is not None and now.id == container.id and now.state == "running"

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


def _simulated_log(container: ContainerInfo) -> list[bytes]:
    name = container.name
    return [
        f"[{name}] simulated container {container.id} started\n".encode(),
        f"[{name}] nothing runs here: the simulated runtime only pretends to\n".encode(),
        f"[{name}] state: {container.state}\n".encode(),
    ]


class SimulatedExecSession:
    """A simulation of a command in a container, for the fleet simulator and tests: nothing runs. What is written
    comes back as output (STDOUT), end of input ends it with status 0, and closing it first ends it as killed (137)."""

    def __init__(self, command: list[str], *, tty: bool, cols: int, rows: int) -> None:
        self.command = command
        self.tty = tty
        self.size = (cols, rows)
        self._output: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._status: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._input_closed = False

    async def read(self) -> tuple[int, bytes] | None:
        if self._status.done() and self._output.empty():
            return None
        data = await self._output.get()
        return (STDOUT, data) if data is not None else None

    async def write(self, data: bytes) -> None:
        if self._input_closed or self._status.done():
            raise BrokenPipeError(errno.EPIPE, "the simulated command's input is closed")
        if data:
            self._output.put_nowait(data)

    async def close_stdin(self) -> None:
        if not self._input_closed:
            self._input_closed = True
            self._end(0)

    async def resize(self, cols: int, rows: int) -> None:
        if self.tty:
            self.size = (cols, rows)

    async def wait(self) -> int:
        return await asyncio.shield(self._status)

    async def close(self) -> None:
        self._end(128 + signal.SIGKILL)

    def _end(self, status: int) -> None:
        if not self._status.done():
            self._status.set_result(status)
            self._output.put_nowait(None)
