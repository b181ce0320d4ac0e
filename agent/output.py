"""The output of the containers this agent deletes, kept on disk until the Master has read it (docs/workloads.md).

When the Master asks for a workload container's deletion, the executor first has the ``OutputKeeper`` read the
container's output (stdout and stderr as the runtime keeps them) into a bounded tail: the last ``limit`` bytes, cut
with a marker. The Master then reads it through a logs tunnel, like a renter reads a live container's output:
``KeptOutputRuntime`` is the runtime as the tunnel server sees it, which answers for a deleted container from what was
kept. Bulk bytes never travel on the control link (docs/renter-access.md, "Bulk bytes and control frames"): the delete's
result carries only sizes.

What is kept is bounded three ways: per container (``limit``), in age (``retention_s``) and in all (``budget_bytes``,
oldest dropped first), so a host that runs many jobs while its Master is away does not fill its disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from agent.runtime.base import STDOUT, ContainerRuntime, ExecSession
from common.containers import ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure
from common.output import DEFAULT_OUTPUT_LIMIT, TailBuffer, last_lines

log = logging.getLogger(__name__)

RUNNING_STATE = "running"
FOLLOW_ATTACH_S = 2.0  # a running container's output is followed from its first chunk before the delete begins
FOLLOW_DRAIN_S = 5.0  # and read this long at most after the delete, for what it printed last
KEPT_STATE = "deleted"  # the state a kept container is reported in (it no longer exists in the runtime)
DEFAULT_RETENTION_S = 7 * 86400.0
DEFAULT_BUDGET_BYTES = 1024 * 1024 * 1024
DATA_SUFFIX, META_SUFFIX = ".out", ".json"


class KeptRecord(msgspec.Struct, kw_only=True):
    """What is known of a kept output besides its bytes."""

    name: str
    labels: dict[str, str] = {}
    exit_code: int | None = None
    seen: int = 0  # bytes the container wrote
    kept: int = 0  # bytes kept (with the marker, when cut)
    truncated: bool = False
    kept_at: float = 0.0


@runtime_checkable
class StoppableRuntime(Protocol):
    """A runtime that stops a container apart from removing it (agent/runtime/docker.py)."""

    async def stop(self, name: str, *, timeout_s: float = 10.0) -> None: ...


class OutputKeeper:
    def __init__(
        self,
        root: Path,
        *,
        limit: int = DEFAULT_OUTPUT_LIMIT,
        retention_s: float = DEFAULT_RETENTION_S,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        self.root = root
        self.limit = limit
        self.retention_s = retention_s
        self.budget_bytes = budget_bytes

    async def keep(self, runtime: ContainerRuntime, name: str) -> KeptRecord | None:
        """Read ``name``'s output from ``runtime`` and keep its tail; None when the runtime has no such container
        (what an earlier delete kept, if any, stays). Called before the container is deleted."""
        info = await runtime.inspect(name)
        if info is None:
            return None
        buffer = TailBuffer(self.limit)
        try:
            async for _channel, data in runtime.logs(name, tail=-1, follow=False):
                buffer.feed(data)
        except RuntimeFailure as exc:  # its output is gone, or the engine refused: keep what came and say so
            log.warning("output of container %s not read whole: %s", name, exc)
        data = buffer.value()
        record = KeptRecord(
            name=name,
            labels=dict(info.labels),
            exit_code=info.exit_code,
            seen=buffer.seen,
            kept=len(data),
            truncated=buffer.truncated,
            kept_at=time.time(),
        )
        await asyncio.to_thread(self._write, record, data)
        return record

    async def keep_through_delete(self, runtime: ContainerRuntime, name: str, *, timeout_s: float) -> ContainerInfo | None:
        """Delete ``name`` (SIGTERM, ``timeout_s``, SIGKILL, removed) keeping its output, including what a running
        container prints between its SIGTERM and its end (a checkpoint's last words, a traceback). A runtime that can
        stop a container apart (``StoppableRuntime``: docker) is stopped, read, then removed; another (process) is
        followed while it stops, from a file that outlives the removal."""
        info = await runtime.inspect(name)
        if info is None:
            return await runtime.delete(name, timeout_s=timeout_s)
        if info.state == RUNNING_STATE and isinstance(runtime, StoppableRuntime):
            await runtime.stop(name, timeout_s=timeout_s)
            info = await runtime.inspect(name) or info
        if info.state != RUNNING_STATE:
            await self.keep(runtime, name)
            return self._noted(name, await runtime.delete(name, timeout_s=timeout_s))
        snapshot = await self.keep(runtime, name)
        followed = TailBuffer(self.limit)
        attached = asyncio.Event()
        task = asyncio.create_task(self._follow(runtime, name, followed, attached), name=f"keep-output-{name}")
        try:
            with contextlib.suppress(TimeoutError):  # it has printed nothing yet: no first chunk to wait for
                await asyncio.wait_for(attached.wait(), FOLLOW_ATTACH_S)
            deleted = await runtime.delete(name, timeout_s=timeout_s)
            with contextlib.suppress(TimeoutError):  # the follow ends with the container; bounded all the same
                await asyncio.wait_for(asyncio.shield(task), FOLLOW_DRAIN_S)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if snapshot is not None and followed.seen > snapshot.seen:
            data = followed.value()
            record = msgspec.structs.replace(
                snapshot, seen=followed.seen, kept=len(data), truncated=followed.truncated, kept_at=time.time()
            )
            await asyncio.to_thread(self._write, record, data)
        return self._noted(name, deleted)

    @staticmethod
    async def _follow(runtime: ContainerRuntime, name: str, into: TailBuffer, attached: asyncio.Event) -> None:
        try:
            async for _channel, data in runtime.logs(name, tail=-1, follow=True):
                into.feed(data)
                attached.set()
        except RuntimeFailure as exc:  # removed under it: what came so far is what it has
            log.debug("following container %s's output ended: %s", name, exc)

    def _noted(self, name: str, deleted: ContainerInfo | None) -> ContainerInfo | None:
        if deleted is not None:
            self.note_exit(name, deleted.exit_code)
        return deleted

    def note_exit(self, name: str, exit_code: int | None) -> None:
        """The exit status a delete learned (a container stopped by the delete had none before)."""
        found = self._meta(name)
        if found is None or exit_code is None or found.exit_code is not None:
            return
        self._write_meta(msgspec.structs.replace(found, exit_code=exit_code))

    def get(self, name: str) -> KeptRecord | None:
        return self._meta(name)

    def read(self, name: str) -> bytes | None:
        try:
            return self._path(name, DATA_SUFFIX).read_bytes()
        except FileNotFoundError:
            return None

    def prune(self, now: float | None = None) -> int:
        """Drop what is older than the retention, then the oldest until all fits the budget; how many went."""
        now = time.time() if now is None else now
        records = sorted((r for r in map(self._meta, self._names()) if r is not None), key=lambda r: r.kept_at)
        total = sum(r.kept for r in records)
        dropped = 0
        for record in records:
            if now - record.kept_at <= self.retention_s and total <= self.budget_bytes:
                break
            self._drop(record.name)
            total -= record.kept
            dropped += 1
        return dropped

    # --- files ------------------------------------------------------------------------------------------

    def _path(self, name: str, suffix: str) -> Path:
        return self.root / f"{name}{suffix}"  # names are checked by common/containers.py: no separators

    def _names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name[: -len(META_SUFFIX)] for p in self.root.iterdir() if p.name.endswith(META_SUFFIX)]

    def _meta(self, name: str) -> KeptRecord | None:
        try:
            return msgspec.json.decode(self._path(name, META_SUFFIX).read_bytes(), type=KeptRecord)
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def _write(self, record: KeptRecord, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        _atomic_write(self._path(record.name, DATA_SUFFIX), data)
        self._write_meta(record)  # last: a record is listed only once its bytes are whole
        self.prune()

    def _write_meta(self, record: KeptRecord) -> None:
        _atomic_write(self._path(record.name, META_SUFFIX), msgspec.json.encode(record))

    def _drop(self, name: str) -> None:
        for suffix in (META_SUFFIX, DATA_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                self._path(name, suffix).unlink()


def _atomic_write(path: Path, data: bytes) -> None:
    """Renters' output is theirs: readable by the agent only (0600), and never seen half-written."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class KeptOutputRuntime:
    """The runtime as the tunnel server sees it: a container the runtime no longer has, whose output is kept, is
    reported (``inspect``) in state ``deleted`` with its labels, and its ``logs`` are the kept ones. Everything else
    is the runtime's own (exec and port tunnels need a running container, so they are refused as before)."""

    def __init__(self, runtime: ContainerRuntime, keeper: OutputKeeper) -> None:
        self.runtime = runtime
        self.keeper = keeper
        self.name = runtime.name
        self.isolation = runtime.isolation

    async def inspect(self, name: str) -> ContainerInfo | None:
        info = await self.runtime.inspect(name)
        if info is not None:
            return info
        kept = self.keeper.get(name)
        if kept is None:
            return None
        return ContainerInfo(
            id="", name=name, runtime=self.runtime.name, state=KEPT_STATE, labels=kept.labels, exit_code=kept.exit_code
        )

    async def logs(self, name: str, *, tail: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        if await self.runtime.inspect(name) is not None:
            async for item in self.runtime.logs(name, tail=tail, follow=follow):
                yield item
            return
        data = self.keeper.read(name)
        if data is None:
            raise RuntimeFailure(f"container {name!r} was deleted from this host and none of its output is kept")
        yield STDOUT, last_lines(data, tail)  # a deleted container writes no more: following ends here

    async def probe(self) -> None:
        await self.runtime.probe()

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        return await self.runtime.create(spec, labels=labels)

    async def delete(self, name: str, *, timeout_s: float = 10.0) -> ContainerInfo | None:
        return await self.runtime.delete(name, timeout_s=timeout_s)

    async def find(self, label_key: str, label_value: str) -> list[ContainerInfo]:
        return await self.runtime.find(label_key, label_value)

    async def list(self) -> list[ContainerInfo]:
        return await self.runtime.list()

    async def close(self) -> None:
        await self.runtime.close()

    async def exec(self, name: str, command: Sequence[str], *, tty: bool, cols: int = 80, rows: int = 24) -> ExecSession:
        return await self.runtime.exec(name, command, tty=tty, cols=cols, rows=rows)

    async def connect(self, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await self.runtime.connect(name, port)
