"""The command ledger: signs container commands, dispatches them, and tracks each one to a final state.

Delivery is at least once (unfinished commands are resent whenever their agent comes back) and
execution at most once (the command id is the agent's idempotency key). A hello resends only what this process had not
sent on the connection that said it: a command created while the hello was being handled went out on that connection
already, and a second copy is needless (and, when a relay tampers the first, a second chance to run what the first
copy's refusal ended; the agent answers it with that refusal, agent/executor.py).

A create's secret fields are sealed in its record (master/command_secrets.py): the store, its backups and replicas
never hold them in clear. The ledger joins them back in memory only to sign and send: at the first send with the spec
it was given, at a resend or a re-signing by opening ``record.sealed`` (one Fernet decryption). A final command is
never sent again, so its sealed fields are dropped when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from common.containers import SPEC_OF_KIND, CommandSpec, ContainerSpec, DeleteSpec, WireSpec, wire_spec
from common.errors import Conflict, IdlegridError, NotFound, is_renter_fault
from common.wire import Command, CommandBody, CommandResult, encode, signing_bytes
from master.allocations import GpuAllocations
from master.command_secrets import decode_secrets, encode_secrets, join, split
from master.events import EventLog
from master.keys import SigningKeyRing
from master.records import AgentRecord, CommandRecord
from master.registry import Registry
from master.secrets import SecretBox, SecretUnreadable
from master.states import COMMAND, FINAL_COMMAND_STATES, AgentState, CommandState
from master.store.base import Store

log = logging.getLogger(__name__)

KINDS = tuple(SPEC_OF_KIND)
_REFUSING_STATES = frozenset({AgentState.RETIRED.value, AgentState.QUARANTINED.value})
CREATE, DELETE = ContainerSpec.kind, DeleteSpec.kind

SendToAgent = Callable[[str, bytes], Awaitable[bool]]


class InvalidCommand(IdlegridError):
    code = "invalid_command"


class CommandLedger:
    def __init__(
        self,
        store: Store,
        events: EventLog,
        registry: Registry,
        keys: SigningKeyRing,
        send: SendToAgent,
        *,
        box: SecretBox,
        timeout_s: float,
    ) -> None:
        self._store = store
        self._box = box  # seals a create's secret fields in its record
        self._events = events
        self._registry = registry
        self._keys = keys
        self._send = send
        self._timeout_s = timeout_s
        self.open: dict[str, CommandRecord] = {}  # commands not yet final
        # Final commands whose record is on its way to the store: shown as they are, so a reader never sees a state
        # older than one the Master has acted on (a poll answered between the two would wait for the store's queue).
        self._landing: dict[str, CommandRecord] = {}
        self._finished: dict[str, asyncio.Event] = {}  # set when the command is final; made for a reader that waits
        self._sent_at: dict[str, float] = {}  # open command id -> when this process last sent it (time.monotonic())
        self.allocations: GpuAllocations = registry.allocations
        # Called with each command that reaches a final state (metrics count them); must not raise.
        self.on_final: Callable[[CommandRecord], None] = lambda record: None

    async def load(self) -> list[str]:
        """Open commands from the store, and the GPU holds they and the agents' containers make.

        Returns what could not be loaded: logged and recorded, the rest is served.
        """
        problems: list[str] = []
        live = [s.value for s in CommandState if s not in FINAL_COMMAND_STATES]
        try:
            records = await self._store.commands.list(states=live, limit=1_000_000)
        except Exception as exc:
            records = []
            problems.append(f"open commands: {exc}")
        for record in records:
            if not math.isfinite(record.deadline):
                # Written before timeouts were checked: it would never expire. It gets the default timeout.
                record.deadline = record.created_at + self._timeout_s
                problems.append(f"command {record.id} had a deadline that never comes; given {self._timeout_s} s")
            self.open[record.id] = record
        problems.extend(await self._seal_inherited())
        dropped = self.allocations.rebuild(
            self._registry.agents.values(),
            [(r, self._gpus_named(r)) for r in self.open.values() if r.kind == CREATE],
            {uuid: gpu.agent_id for uuid, gpu in self._registry.gpus.items()}
            | {m.uuid: gpu.agent_id for gpu in self._registry.gpus.values() for m in gpu.info.mig_instances},
        )
        problems.extend(f"GPU hold dropped, its GPU is gone or taken: {what}" for what in dropped)
        for problem in problems:
            log.error("command ledger: %s", problem)
            await self._events.record("master.load_failed", "commands", problem=problem)
        return problems

    def _gpus_named(self, record: CommandRecord) -> list[str]:
        host = self._registry.gpus_of(record.agent_id)
        by_name = {g.uuid: g.uuid for g in host} | {str(g.index): g.uuid for g in host}
        by_name |= {m.uuid: m.uuid for g in host for m in g.info.mig_instances}
        return [by_name[name] for name in record.spec.get("gpus", []) or [] if name in by_name]

    def target(self, agent_id: str) -> AgentRecord:
        """The host a command for ``agent_id`` goes to: NotFound when there is none, Conflict when it takes no
        commands (retired or quarantined)."""
        agent = self._registry.get(agent_id)
        if agent.state in _REFUSING_STATES:
            raise Conflict(f"agent {agent_id} is {agent.state} and takes no commands")
        return agent

    async def create(self, agent_id: str, spec: CommandSpec, *, timeout_s: float | None = None) -> CommandRecord:
        """Sign, store and dispatch the command ``spec`` is the body of; refused before dispatch (Conflict) when the
        host or its GPUs cannot take it, InvalidCommand when ``spec`` breaks its type's constraints."""
        agent = self.target(agent_id)
        kind, wire = spec.kind, _wire(spec)
        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
            raise InvalidCommand(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if isinstance(spec, ContainerSpec) and (agent.drained or agent.state == AgentState.MAINTENANCE.value):
            raise Conflict(f"agent {agent_id} is drained and takes no new containers; undrain it first")
        now = time.time()
        signer = self._keys.current
        stored, secrets = split(wire) if isinstance(spec, ContainerSpec) else (wire, None)  # only a create carries secrets
        body = CommandBody(
            id="cmd-" + uuid.uuid4().hex,
            agent_id=agent_id,
            kind=kind,
            spec=wire,
            issued_at=now,
            deadline=now + (timeout_s or self._timeout_s),
            key_id=signer.key_id,
        )
        record = CommandRecord(
            id=body.id,
            agent_id=agent_id,
            kind=kind,
            spec=stored,
            state=CommandState.PENDING.value,
            created_at=now,
            deadline=body.deadline,
            signature=signer.sign(signing_bytes(body)),
            key_id=body.key_id,
            sealed="" if secrets is None else self._box.seal(encode_secrets(secrets).decode()),
        )
        if isinstance(spec, ContainerSpec):
            uuids = self.allocations.resolve(agent_id, self._registry.gpus_of(agent_id), spec.gpus)
            self.allocations.claim(agent_id, spec.name, record.id, uuids)
        try:
            await self._store.commands.put(record)
        except BaseException:
            self.allocations.abandon(record.id)
            raise
        self.open[record.id] = record
        # Stored, it goes out at once; what records it (an event, the GPUs it reserves: in memory before it goes) is
        # written meanwhile. Each write waits its turn on the store's one thread, and in a storm of hellos a turn took
        # a tenth of a second or more: four in a row held the frame back 0.2-0.4 s (bench/HISTORY.md).
        bookkeeping = [self._events.record("command.created", record.id, agent_id=agent_id, kind=kind)]
        if isinstance(spec, ContainerSpec):
            bookkeeping.append(self._registry.settle_gpus(agent))
        *recorded, dispatched = await asyncio.gather(*bookkeeping, self.dispatch(record, wire), return_exceptions=True)
        if isinstance(dispatched, BaseException):
            raise dispatched
        for failed in recorded:
            if isinstance(failed, BaseException):  # the command is stored and on its way: a retry would send it twice
                log.error("command %s: its bookkeeping was not written: %r", record.id, failed)
        return record

    async def get(self, command_id: str, *, wait_s: float = 0.0) -> CommandRecord:
        """The command as it stands; an open one after it is final or ``wait_s`` seconds have passed, if sooner."""
        if wait_s > 0 and command_id in self.open:
            finished = self._finished.setdefault(command_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), wait_s)
        record = self.open.get(command_id) or self._landing.get(command_id) or await self._store.commands.get(command_id)
        if record is None:
            raise NotFound(f"no command {command_id!r}")
        return record

    def wake_readers(self) -> None:
        """Every read waiting for a command to be final (``get``'s ``wait_s``) answers now: the Master is stopping."""
        for finished in self._finished.values():
            finished.set()
        self._finished.clear()

    async def dispatch(self, record: CommandRecord, spec: WireSpec | None = None) -> None:
        """Send (or resend) a command if its agent is reachable; a miss is retried on reconnect. ``spec``: the command's
        whole spec when the caller holds it (its creation), else it is opened from the record."""
        whole = spec if spec is not None else self._whole_spec(record)
        if whole is None:
            return  # it cannot be opened here: it stays open until its deadline (logged)
        if self._keys.is_retired(record.key_id):
            await self._resign(record, whole)  # agents refuse what a retired key signed
        frame = encode(Command(body=_body(record, whole), signature=record.signature))
        if not await self._send(record.agent_id, frame):
            return
        self._sent_at[record.id] = time.monotonic()
        record.attempts += 1
        if record.state == CommandState.PENDING.value:
            record.sent_at = time.time()
            await self._move(record, "send")
        else:
            await self._store.commands.put(record)

    async def resign_retired(self, key_id: str) -> list[str]:
        """Re-sign every open command ``key_id`` signed with the current key; returns their ids.

        Done when the key is retired, so that nothing it signed is ever sent again. What an agent
        already holds is unaffected: it remembers executed ids, and a resend carries the new signature.
        """
        stale = [r for r in self.open.values() if r.key_id == key_id]
        for record in stale:
            whole = self._whole_spec(record)
            if whole is not None:
                await self._resign(record, whole)
        return [r.id for r in stale]

    async def _resign(self, record: CommandRecord, whole: WireSpec) -> None:
        old_key, signer = record.key_id, self._keys.current
        record.key_id = signer.key_id
        record.signature = signer.sign(signing_bytes(_body(record, whole)))
        record.version += 1
        await self._store.commands.put(record)
        await self._events.record("command.resigned", record.id, agent_id=record.agent_id, old_key=old_key, key=signer.key_id)

    def _whole_spec(self, record: CommandRecord) -> WireSpec | None:
        """The spec the agent gets: the record's, with its sealed fields opened; None (logged) when this Master's
        secrets.key cannot open them (another Master's key): the command is never sent, and times out."""
        if not record.sealed:
            return record.spec
        try:
            return join(record.spec, decode_secrets(self._box.unseal(record.sealed).encode()))
        except SecretUnreadable as exc:
            log.error("command %s cannot be sent: %s", record.id, exc, extra={"agent_id": record.agent_id})
            return None

    async def _seal_inherited(self) -> list[str]:
        """Seal the secret fields of open commands an older Master stored in clear; what could not be rewritten."""
        problems = []
        for record in self.open.values():
            stored, secrets = split(record.spec) if not record.sealed else (record.spec, None)
            if secrets is None:
                continue
            record.spec, record.sealed = stored, self._box.seal(encode_secrets(secrets).decode())
            try:
                await self._store.commands.put(record)
            except Exception as exc:
                problems.append(f"command {record.id}: its secret fields could not be sealed in the store: {exc}")
        return problems

    async def resend_for(self, agent_id: str, *, sent_before: float = math.inf) -> int:
        """Send again the agent's open commands, oldest first, except those this process sent at ``sent_before`` or
        later (``time.monotonic()``; a hello's arrival: what went out since went on the connection that said it);
        how many went."""
        sent_at = self._sent_at
        pending = sorted(
            (r for r in self.open.values() if r.agent_id == agent_id and sent_at.get(r.id, -math.inf) < sent_before),
            key=lambda r: r.created_at,
        )
        for record in pending:
            await self.dispatch(record)
        return len(pending)

    async def on_ack(self, agent_id: str, command_id: str) -> None:
        record = self._owned(agent_id, command_id)
        if record is not None and COMMAND.allows(record.state, "ack"):
            record.acked_at = time.time()
            await self._move(record, "ack")

    async def on_result(self, agent_id: str, result: CommandResult) -> None:
        record = self._owned(agent_id, result.id)
        if record is None:
            return  # already final (a resent result) or not this agent's: the ack is still sent by the caller
        event = "succeed" if result.ok else "fail"
        record.result, record.error = result.result, result.error
        if result.error_code:
            record.result = {**record.result, "error_code": result.error_code}
        record.finished_at = time.time()
        writes = [self._move(record, event)]  # first: the command is final before anything else moves
        agent = self._registry.agents.get(agent_id)
        if agent is not None:
            self._count_result(agent, record, result)
            writes.append(self._track_gpus(record, ok=result.ok))
            if not result.ok and result.error_code == "bad_signature":
                writes.append(self._events.record("command.refused", record.id, agent_id=agent_id, reason=result.error or ""))
            writes.append(self._registry.save(agent))
        # Side by side, in this order: each write queues on the store's thread behind the one before it, not behind
        # everything queued while the one before it was written. The agent's ack waits for all of them.
        await asyncio.gather(*writes)

    @staticmethod
    def _count_result(agent: AgentRecord, record: CommandRecord, result: CommandResult) -> None:
        # A start the renter's request made fail (docs/images.md) costs the host nothing: no reputation counter moves.
        # Only a create can fail through the renter's request: a delete (or any other kind) claiming so is the host's.
        renters = not result.ok and record.kind == "create_container" and is_renter_fault(result.error_code)
        if result.ok:
            agent.commands_succeeded += 1
        elif not renters:
            agent.commands_failed += 1
        if record.kind == "create_container" and result.error_code != "bad_signature":  # reputation: container_success
            if result.ok:
                agent.containers_started += 1
            elif renters:
                agent.containers_refused += 1
            else:
                agent.containers_failed += 1

    async def expire(self, now: float, *, spare_created_before: float = 0.0) -> list[str]:
        """Time out open commands past their deadline, except those created before ``spare_created_before``
        (a restarted Master spares what it inherited a while: their results may be on their way from a relay)."""
        expired = [r for r in self.open.values() if r.deadline < now and r.created_at >= spare_created_before]
        for record in expired:
            record.finished_at, record.error = now, "deadline passed before the agent reported a result"
            await self._move(record, "expire")
            await self._track_gpus(record, ok=False)
        return [r.id for r in expired]

    def _owned(self, agent_id: str, command_id: str) -> CommandRecord | None:
        record = self.open.get(command_id)
        if record is not None and record.agent_id != agent_id:
            log.warning("agent %s reported on command %s of agent %s; ignored", agent_id, command_id, record.agent_id)
            return None
        return record

    async def _move(self, record: CommandRecord, event: str) -> None:
        old, record.state = record.state, COMMAND.next(record.state, event)
        record.version += 1

        def written() -> Awaitable[Any]:  # the record and its event side by side: the event queues right behind it
            transition = self._events.transition("command", record.id, old, record.state, event, agent_id=record.agent_id)
            return asyncio.gather(self._store.commands.put(record), transition)

        if record.state not in _FINAL:
            await written()
            return
        self.open.pop(record.id, None)
        self._sent_at.pop(record.id, None)
        record.sealed = ""  # never sent again: its secret fields need not be kept at all
        self._landing[record.id] = record
        self.on_final(record)
        finished = self._finished.pop(record.id, None)
        if finished is not None:
            finished.set()
        try:
            await written()
        finally:
            if self._landing.get(record.id) is record:
                del self._landing[record.id]

    async def _track_gpus(self, record: CommandRecord, *, ok: bool) -> None:
        """A final container command moves its GPU holds: a create that started confirms them (and the agent
        record lists the container, which is what a restart rebuilds from); one that did not gives them back;
        a delete that succeeded frees that container's GPUs and no other."""
        agent = self._registry.get(record.agent_id)
        name = record.spec["name"]
        if record.kind == CREATE and ok:
            agent.containers = {**agent.containers, name: self.allocations.confirm(record.id)}
        elif record.kind == CREATE:
            self.allocations.abandon(record.id)
        elif ok:
            self.allocations.release(agent.id, name)
            agent.containers = {k: v for k, v in agent.containers.items() if k != name}
            if name in agent.exited:  # an ended container is gone once deleted
                agent.exited = {k: v for k, v in agent.exited.items() if k != name}
        await self._registry.settle_gpus(agent)


_FINAL = frozenset(s.value for s in FINAL_COMMAND_STATES)


def command_spec(kind: str, spec: WireSpec) -> CommandSpec:
    """The typed body of a ``kind`` command from its JSON (a raw command from the API): InvalidCommand names the kind,
    and the field that is wrong."""
    spec_type = SPEC_OF_KIND.get(kind)
    if spec_type is None:
        raise InvalidCommand(f"unknown command kind {kind!r}; expected one of {', '.join(KINDS)}")
    try:
        return msgspec.convert(spec, spec_type)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        raise InvalidCommand(f"invalid {kind} spec: {exc}") from None


def _wire(spec: CommandSpec) -> WireSpec:
    """The JSON body the ledger signs for ``spec``, checked against its type's constraints: a spec built directly
    (the runner's, the book's) was not checked when it was built, and a host is never sent a body it would refuse.
    It is stored in the command's record, its secret fields sealed (``split``)."""
    wire = wire_spec(spec)
    command_spec(spec.kind, wire)
    return wire


def _body(record: CommandRecord, spec: WireSpec) -> CommandBody:
    return CommandBody(
        id=record.id,
        agent_id=record.agent_id,
        kind=record.kind,
        spec=spec,
        issued_at=record.created_at,
        deadline=record.deadline,
        key_id=record.key_id,
    )
