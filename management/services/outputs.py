"""The output collector: reads a deleted workload container's output from its host and keeps it (docs/workloads.md).

Who does what, in order:

1. The workload book, as it asks for a container's deletion (``WorkloadBook._end``: the workload succeeded, failed,
   was cancelled, preempted or requeued), stores a ``pending`` ``KeptOutput`` for it first.
2. The agent, running the delete, reads the container's output into a bounded tail (its last 8 MiB by default, cut
   with a marker) and keeps it on disk (agent/output.py); the delete's result says how much (sizes only).
3. This collector, a small loop, reads each pending one once its delete is done: through a logs tunnel from the
   relay, as a renter's client would, so bulk bytes never travel on the control link (docs/renter-access.md, "Bulk
   bytes and control frames"). It bounds what it reads again (an agent's figures are not trusted), stores it ``kept``, and
   marks the assignment ``deleted``; a failed workload's reason gets the last lines (``reason_tail``: at most
   ``reason_lines`` lines and ``reason_chars`` characters, escape sequences and control characters taken out, so a
   reason stays one short, printable paragraph wherever it is shown). A host that left the grid, a
   container that never ran, or a host that stays away past ``give_up_s``, makes it ``lost`` with the reason.
4. Retention: kept and lost records go ``retention_s`` after the container's end.

``decide`` is the pure part (what to do with one pending record, from what the Master knows now); ``collect`` carries
it out. A pending record survives a Master restart in the store, so collection goes on after one.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from common.errors import IdlegridError
from common.output import DEFAULT_OUTPUT_LIMIT, last_lines
from management.store.outputs import OutputRepo
from management.workloads.book import WorkloadBook
from management.workloads.states import WorkloadState
from master.port import (
    AgentRecord,
    AgentState,
    CommandRecord,
    CommandState,
    KeptOutput,
    Loop,
    MasterConfig,
    MasterPort,
    TunnelUnavailable,
    stop_loop,
)

log = logging.getLogger(__name__)

_GONE_HOST = frozenset({AgentState.RETIRED.value, AgentState.QUARANTINED.value})
_OPEN_COMMAND = frozenset({CommandState.PENDING.value, CommandState.SENT.value, CommandState.ACKED.value})
PENDING_PAGE = 100  # pending outputs looked at per step, oldest first
NOT_KEPT = "does not run on this host"  # the agent's refusal of a logs tunnel when it has nothing (agent/tunnel.py)


class OutputSettings(msgspec.Struct, frozen=True, kw_only=True):
    period_s: float = 2.0  # the collector looks at pending outputs this often (and when a renter asks for one)
    limit_bytes: int = DEFAULT_OUTPUT_LIMIT  # the most the Master keeps of one container (its last bytes)
    retention_s: float = 7 * 86400.0  # kept output is deleted this long after its container ended
    give_up_s: float = 86400.0  # a host that has not let its output be read by then: it is lost
    max_tries: int = 5  # reads that failed (the tunnel broke) before the output is given up
    read_timeout_s: float = 60.0  # one read from a host
    reason_lines: int = 3  # a failed workload's reason carries this many last lines of each failed replica
    reason_chars: int = 300  # and at most this many characters of them (the last ones)
    commands_looked_at: int = 500  # the host's newest commands searched for the container's delete

    @classmethod
    def of(cls, config: MasterConfig) -> OutputSettings:
        return cls(limit_bytes=config.output_limit_bytes, retention_s=config.output_retention_s)


@dataclass(frozen=True, slots=True)
class Wait:
    why: str


@dataclass(frozen=True, slots=True)
class Read:
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class Lose:
    why: str


Decision = Wait | Read | Lose


def decide(
    kept: KeptOutput,
    agent: AgentRecord | None,
    linked: bool,
    delete: CommandRecord | None,
    now: float,
    settings: OutputSettings,
) -> Decision:
    """What to do with a pending output now. ``agent``: its host as the registry has it (None: not in the grid);
    ``linked``: whether the host is connected (not offline); ``delete``: the newest ``delete_container`` of the
    container on it."""
    if agent is None or agent.state in _GONE_HOST:
        return Lose(f"host {kept.agent_id} left the grid before its output could be read")
    exit_code = _exit_code(delete)
    if delete is not None and delete.state == CommandState.SUCCEEDED.value and "output" not in (delete.result or {}):
        return Lose("the container was not on its host when it was deleted (it had not started)")
    waiting = (
        Wait(f"host {kept.agent_id} is still deleting the container")
        if kept.container in agent.containers or (delete is not None and delete.state in _OPEN_COMMAND)
        else Wait(f"host {kept.agent_id} is not connected")
        if not linked
        else None
    )
    if waiting is not None:
        if now - kept.ended_at > settings.give_up_s:
            return Lose(f"{waiting.why} after {settings.give_up_s:g} s")
        return waiting
    if kept.tries >= settings.max_tries:
        return Lose(f"reading it from host {kept.agent_id} failed {kept.tries} times")
    return Read(exit_code)


def _exit_code(delete: CommandRecord | None) -> int | None:
    container = (delete.result or {}).get("container") if delete is not None else None
    code = container.get("exit_code") if isinstance(container, dict) else None
    return code if isinstance(code, int) else None


class OutputCollector:
    def __init__(
        self,
        master: MasterPort,
        book: WorkloadBook,
        outputs: OutputRepo,
        read: Callable[[KeptOutput], Awaitable[bytes]],
        settings: OutputSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        restart_s: float = 1.0,
    ) -> None:
        """``read``: the container's output from its host (RenterAccess.read_output, bounded by ``limit_bytes``)."""
        self.master = master
        self.book = book
        self.outputs = outputs
        self.read = read
        self.settings = settings or OutputSettings()
        self._clock = clock
        self._busy: dict[str, asyncio.Future[KeptOutput]] = {}  # one read per output at a time
        self.loop = Loop("output-collector", self.settings.period_s, self.step, restart_s)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = self.loop.start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None

    async def step(self) -> None:
        now = self._clock()
        await self.outputs.delete_before(now - self.settings.retention_s)
        for kept in await self.outputs.list(state="pending", limit=PENDING_PAGE):
            await self.collect(kept)

    async def collect(self, kept: KeptOutput) -> KeptOutput:
        """Carry out ``decide`` for one pending output; the record as it is after (still pending when it must wait)."""
        running = self._busy.get(kept.id)
        if running is not None:  # the loop and a renter's request at once: one read
            return await asyncio.shield(running)
        future: asyncio.Future[KeptOutput] = asyncio.get_running_loop().create_future()
        self._busy[kept.id] = future
        try:
            result = await self._collect(kept)
            future.set_result(result)
            return result
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a waiter that went away must not leave it unobserved
            raise
        finally:
            del self._busy[kept.id]

    async def _collect(self, kept: KeptOutput) -> KeptOutput:
        now = self._clock()
        agent = self.master.registry.agents.get(kept.agent_id)
        delete = await self._delete_of(kept) if agent is not None else None
        linked = agent is not None and agent.state != AgentState.OFFLINE.value
        decision = decide(kept, agent, linked, delete, now, self.settings)
        if isinstance(decision, Wait):
            return kept
        if isinstance(decision, Lose):
            return await self._settle(kept, "lost", reason=decision.why)
        try:
            data = await asyncio.wait_for(self.read(kept), self.settings.read_timeout_s)
        except TunnelUnavailable:  # its link is down for now: no try lost, ``give_up_s`` bounds the wait
            return kept
        except (IdlegridError, TimeoutError, OSError) as exc:
            if NOT_KEPT in str(exc):
                return await self._settle(kept, "lost", reason=f"host {kept.agent_id} kept none of its output")
            log.warning("output of %s not read yet: %s", kept.container, exc, extra={"agent_id": kept.agent_id})
            tried = msgspec.structs.replace(kept, tries=kept.tries + 1)
            await self.outputs.put(tried)
            return tried
        truncated = data.startswith(b"[idlegrid: output cut:")
        return await self._settle(kept, "kept", data=data, truncated=truncated, exit_code=decision.exit_code)

    async def _delete_of(self, kept: KeptOutput) -> CommandRecord | None:
        commands = await self.master.list_commands(agent_id=kept.agent_id, limit=self.settings.commands_looked_at)
        for command in commands:  # newest first
            if command.kind == "delete_container" and command.spec.get("name") == kept.container:
                return command
        return None

    async def _settle(
        self,
        kept: KeptOutput,
        state: Literal["kept", "lost"],
        *,
        reason: str = "",
        data: bytes = b"",
        truncated: bool = False,
        exit_code: int | None = None,
    ) -> KeptOutput:
        done = msgspec.structs.replace(
            kept, state=state, reason=reason, data=data, truncated=truncated, exit_code=exit_code, collected_at=self._clock()
        )
        await self.outputs.put(done)  # stored before the assignment is marked: a crash in between reads it again
        note = await self._failure_note(done)
        await self.book.settle(kept.workload_id, kept.container, note=note)
        log.info(
            "workload output %s",
            state,
            extra={"workload": kept.workload_id, "container": kept.container, "bytes": len(data), "reason": reason},
        )
        return done

    async def _failure_note(self, done: KeptOutput) -> str:
        """For a failed workload, a replica that did not exit 0: its last lines, for the workload's reason."""
        if done.state != "kept" or done.exit_code == 0 or not done.data:
            return ""
        rec = self.book.open_workload(done.workload_id) or await self.book.get(done.workload_id)
        if rec.state != WorkloadState.FAILED:
            return ""
        tail = reason_tail(done.data, self.settings.reason_lines, self.settings.reason_chars)
        return f"\nlast lines of replica {done.replica}:\n{tail}" if tail else ""


# Terminal escape sequences (colours, cursor moves: CSI; titles, links: OSC), taken out whole, not left as "[31m".
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
_CUT = "…"
REASON_BYTES_READ = 64 * 1024


def reason_tail(data: bytes, lines: int, chars: int) -> str:
    """The last ``lines`` non-blank lines of a container's output as a reason shows them: a progress bar's line as it
    was last drawn (after its last ``\\r``), escape sequences and every other control or format character taken out
    (tabs become spaces), then its last ``chars`` characters, cut with "…" at the front when longer."""
    # Room for blank lines, which do not count; and a bound on the bytes looked at, whatever one line's length.
    text = last_lines(data, lines * 4)[-REASON_BYTES_READ:].decode("utf-8", "replace")
    kept: list[str] = []
    for raw in text.split("\n"):
        line = _ESCAPES.sub("", raw.rstrip("\r").rsplit("\r", 1)[-1]).replace("\t", " ")
        line = "".join(c for c in line if unicodedata.category(c) not in ("Cc", "Cf")).strip()
        if line:
            kept.append(line)
    tail = "\n".join(kept[-lines:]) if lines > 0 else ""
    return tail if len(tail) <= chars else _CUT + tail[-(chars - len(_CUT)) :].lstrip()
