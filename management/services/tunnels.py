"""Renter access through the relays (the tunnels service): ``RenterAccess.open`` checks who may open which
tunnel, mints the ticket (common/tunnel.py), has the Master tell the agent to dial, and answers where to connect.

Only the workload's owner (or an operator) opens a tunnel to it, only while a replica of it runs, a port tunnel only
to a port the workload declared; every opening is an audit event (``tunnel.opened``) naming the account, the
workload, the kind and the port.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Annotated, Literal

import msgspec

from common.errors import Conflict, IdlegridError, NotFound
from common.output import MARKER_ROOM, TailBuffer, bounded, last_lines
from common.tunnel import Op, TunnelKind, encode_ticket
from management.client.tunnel import Tunnel, TunnelClosed, TunnelGrant
from management.store.outputs import OutputRepo
from management.views.base import StructFields
from management.workloads.states import AssignmentState
from master.port import Assignment, KeptOutput, MasterPort, WorkloadRecord

Arg = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
DEFAULT_SHELL = ("/bin/sh",)
MAX_COMMAND_BYTES = 2048  # an exec command travels in the ticket, which travels in a header
STDOUT, STDERR = 1, 2  # as agent/runtime/base.py numbers them
# The account a ticket names when the Master itself reads a deleted container's output (its ``tunnel.opened`` event
# and the relay's logs say so; no renter's tunnel allowance is spent on it).
OUTPUT_READER = "idlegrid-master"


class TunnelRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/workloads/{id}/tunnels: what the renter wants to reach."""

    kind: Literal["logs", "exec", "port", "ssh"]
    replica: Annotated[int, msgspec.Meta(ge=0, le=1023)] = 0  # which replica of a gang
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0  # kind port: the container's port (1-65535)
    command: Annotated[list[Arg], msgspec.Meta(max_length=64)] = []  # kind exec; [] runs /bin/sh
    tty: bool = False  # kind exec
    cols: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    rows: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    tail: Annotated[int, msgspec.Meta(ge=-1, le=1_000_000)] = 100  # kind logs
    follow: bool = False  # kind logs


class RenterAccess:
    """``Services.tunnels``: open a tunnel to a replica of a workload for its owner (or an operator)."""

    def __init__(self, master: MasterPort, workloads: Callable[..., Awaitable[WorkloadRecord]], outputs: OutputRepo) -> None:
        self._master = master
        self._workload = workloads  # WorkloadsService.get_workload: 404 for another account's
        self._outputs = outputs  # the kept output of deleted containers
        # management/services/outputs.py's OutputCollector.collect, once made: a pending output is read from its host at once
        self.collect: Callable[[KeptOutput], Awaitable[KeptOutput]] | None = None
        # management/services/ssh_keys.py's SshKeysService.fingerprints: the keys an ``ssh`` ticket lets in (docs/ssh.md)
        self.ssh_fingerprints: Callable[[str], Awaitable[list[str]]] | None = None

    async def open(self, workload_id: str, request: TunnelRequest, *, account: str, owner: str | None) -> TunnelGrant:
        """A grant for ``account`` (the caller) to reach ``workload_id``; ``owner``: the scope (None: operator)."""
        kind = TunnelKind(request.kind)
        params = _ticket_fields(kind, request)  # a bad request is a 400 whatever the workload's state
        workload = await self._workload(workload_id, account=owner)
        if kind is TunnelKind.PORT:
            _check_declared(workload, request.port)
        if kind is TunnelKind.SSH:
            params["ssh_keys"] = await self._ssh_keys(account)
        assignment = _assignment(workload, request)
        return await self._grant(kind, account, workload.id, assignment.agent_id, assignment.container, params)

    async def _ssh_keys(self, account: str) -> list[str]:
        """The fingerprints of the caller's SSH keys: only they open an SSH session through this ticket."""
        found = await self.ssh_fingerprints(account) if self.ssh_fingerprints is not None else []
        if not found:
            raise Conflict(
                f"account {account} has no SSH public keys, so no SSH session could log in: add one "
                "(idlegrid ssh-key add ~/.ssh/id_ed25519.pub, or POST /api/v1/ssh-keys)"
            )
        return found

    async def _grant(
        self, kind: TunnelKind, account: str, workload: str, agent_id: str, container: str, params: StructFields
    ) -> TunnelGrant:
        opened = await self._master.open_tunnel(
            kind, account=account, workload=workload, agent_id=agent_id, container=container, **params
        )
        body = opened.ticket.body
        return TunnelGrant(
            id=body.id,
            kind=body.kind,
            workload=workload,
            agent_id=body.agent_id,
            relay_id=body.relay_id,
            url=opened.url,
            ticket=encode_ticket(opened.ticket),
            ca_pem=self._master.ca_chain_pem().decode(),
            expires_at=body.expires_at,
        )

    async def read_output(self, kept: KeptOutput, *, limit: int) -> bytes:
        """All a host has of ``kept``'s container's output (kept by its agent once deleted), read by the Master itself
        through a logs tunnel, as a renter's client would (bulk bytes never travel on the control link): its last
        ``limit`` bytes, cut with a marker. TunnelClosed, TunnelUnavailable when it cannot be read now."""
        params = {"tail": -1, "follow": False}
        grant = await self._grant(TunnelKind.LOGS, OUTPUT_READER, kept.workload_id, kept.agent_id, kept.container, params)
        buffer = TailBuffer(limit + MARKER_ROOM)  # an agent's own marker (with the same bound) is kept, not cut again
        async with await Tunnel.open(grant) as tunnel:
            while (frame := await tunnel.receive()) is not None:
                if frame.op in (Op.DATA, Op.STDERR):
                    buffer.feed(frame.payload)
                elif frame.op is Op.ERROR:
                    raise TunnelClosed(frame.payload.decode("utf-8", "replace"))
                elif frame.op is Op.EXIT:
                    return bounded(buffer.value(), limit)[0]
            raise TunnelClosed(tunnel.why() if tunnel.close_code not in (None, 1000) else "the tunnel ended early")

    async def logs(
        self, workload_id: str, request: TunnelRequest, *, account: str, owner: str | None, attempt: int | None = None
    ) -> AsyncGenerator[tuple[int, bytes], None]:
        """The output of a replica, through a logs tunnel the Master itself dials: ``(STDOUT|STDERR, bytes)`` until it
        ends (or, following, until the caller stops iterating). Refusals raise before the first item. Once the
        replica's container is deleted (the workload ended, was preempted or requeued), or for an earlier
        ``attempt``, it is the output the Master kept (``kept_output``)."""
        workload = await self._workload(workload_id, account=owner)
        live = _live_logs(workload, request.replica)
        if live is None or (attempt is not None and attempt != workload.attempts):
            kept = await self.kept_output(workload, request.replica, attempt)
            yield STDOUT, last_lines(kept.data, request.tail)
            return
        grant = await self.open(workload_id, request, account=account, owner=owner)
        async with await Tunnel.open(grant) as tunnel:
            while True:
                frame = await tunnel.receive()
                if frame is None:
                    if tunnel.close_code not in (None, 1000):
                        raise TunnelClosed(tunnel.why())
                    return
                if frame.op in (Op.DATA, Op.STDERR):
                    yield (STDERR if frame.op is Op.STDERR else STDOUT), frame.payload
                elif frame.op is Op.ERROR:
                    raise TunnelClosed(frame.payload.decode("utf-8", "replace"))
                elif frame.op is Op.EXIT:
                    return

    async def kept_output(self, workload: WorkloadRecord, replica: int, attempt: int | None) -> KeptOutput:
        """The output the Master kept of ``replica`` of ``workload`` (the caller checked who may see it): of
        ``attempt``, or of the latest attempt that has one. One still on its host is read from there now."""
        found = sorted(
            (k for k in await self._outputs.list(workload_id=workload.id) if k.replica == replica), key=lambda k: k.attempt
        )
        if attempt is not None:
            found = [k for k in found if k.attempt == attempt]
        if not found:
            if not workload.assignments and workload.attempts == 0:
                raise Conflict(f"workload {workload.id} is {workload.state}: it never ran, so it has no output")
            which = f"attempt {attempt}" if attempt is not None else "any attempt"
            raise NotFound(f"workload {workload.id} has no output kept for replica {replica} of {which}")
        kept = found[-1]
        if kept.state == "pending" and self.collect is not None:
            kept = await self.collect(kept)
        if kept.state == "pending":
            raise Conflict(
                f"the output of workload {workload.id} replica {replica} (attempt {kept.attempt}) is still on host "
                f"{kept.agent_id}, which is deleting its container; try again in a few seconds"
            )
        if kept.state == "lost":
            raise NotFound(
                f"no output of workload {workload.id} replica {replica} (attempt {kept.attempt}) was kept: {kept.reason}"
            )
        return kept


class InvalidTunnel(IdlegridError):
    """A tunnel that cannot be opened as asked (the request's fault: 400)."""

    code = "invalid_tunnel"


def _ticket_fields(kind: TunnelKind, request: TunnelRequest) -> StructFields:
    """The kind's fields of the ticket, checked."""
    if kind is TunnelKind.PORT:
        if not 1 <= request.port <= 65535:
            raise InvalidTunnel("port: a port tunnel names the container's port, 1 to 65535")
        return {"port": request.port}
    if kind is TunnelKind.EXEC:
        for n, arg in enumerate(request.command):
            if "\0" in arg:  # a C string ends there: the container would run a shorter argument than was asked
                raise InvalidTunnel(f"command[{n}]: an argument may not hold a NUL byte (\\u0000); remove it")
        if sum(len(arg.encode()) + 3 for arg in request.command) > MAX_COMMAND_BYTES:
            raise InvalidTunnel(f"command: at most {MAX_COMMAND_BYTES} bytes in all (it travels in the ticket)")
        return {"command": list(request.command or DEFAULT_SHELL), "tty": request.tty, "cols": request.cols, "rows": request.rows}
    if kind is TunnelKind.SSH:
        return {}  # the keys that may log in are the caller's (RenterAccess._ssh_keys)
    return {"tail": request.tail, "follow": request.follow}


def _check_declared(workload: WorkloadRecord, port: int) -> None:
    """A port tunnel reaches only a port the workload declared in its spec: never the host's own ports, another
    container's or the platform's (the agent checks it again against the ports its create command named)."""
    declared = workload.spec.ports
    if port not in declared:
        named = f"declares ports {', '.join(map(str, declared))}" if declared else "declares no ports"
        raise InvalidTunnel(
            f"port: workload {workload.id} {named}; a port tunnel reaches only those, not {port} "
            "(declare a port in the workload's spec to reach it)"
        )


def _live_logs(workload: WorkloadRecord, replica: int) -> Assignment | None:
    """The replica's container when a logs tunnel reaches it live (running, or exited and not yet deleted)."""
    for assignment in workload.assignments:
        if assignment.replica == replica and assignment.state in (AssignmentState.RUNNING, AssignmentState.EXITED):
            return assignment
    return None


def _assignment(workload: WorkloadRecord, request: TunnelRequest) -> Assignment:
    """The replica's container, when it is there to reach: running (logs also once it has exited)."""
    reachable = (
        (AssignmentState.RUNNING, AssignmentState.EXITED) if request.kind == TunnelKind.LOGS.value else (AssignmentState.RUNNING,)
    )
    for assignment in workload.assignments:
        if assignment.replica != request.replica:
            continue
        if assignment.state in reachable:
            return assignment
        raise Conflict(
            f"workload {workload.id} replica {request.replica} is {assignment.state} on {assignment.agent_id}; "
            f"a {request.kind} tunnel needs it {' or '.join(reachable)}"
        )
    if not workload.assignments:
        raise Conflict(f"workload {workload.id} is {workload.state}: it runs nowhere yet, so there is nothing to reach")
    raise InvalidTunnel(f"replica: workload {workload.id} has no replica {request.replica}")
