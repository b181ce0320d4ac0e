"""Renter access through the relays, as the façade offers it: ``RenterAccess.open`` checks who may open which
tunnel, mints the ticket (common/tunnel.py), has the Master tell the agent to dial, and answers where to connect.

Only the workload's owner (or an operator) opens a tunnel to it, only while a replica of it runs, a port tunnel only
to a port the workload declared; every opening is an audit event (``tunnel.opened``) naming the account, the
workload, the kind and the port.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Annotated, Any, Literal

import msgspec

from common.errors import Conflict, IdlegridError
from common.tunnel import Op, TunnelKind, encode_ticket
from management.tunnel_client import Tunnel, TunnelClosed, TunnelGrant
from master.records import Assignment, WorkloadRecord
from master.service import Master

Arg = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
DEFAULT_SHELL = ("/bin/sh",)
MAX_COMMAND_BYTES = 2048  # an exec command travels in the ticket, which travels in a header
STDOUT, STDERR = 1, 2  # as agent/runtime/base.py numbers them


class TunnelRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/workloads/{id}/tunnels: what the renter wants to reach."""

    kind: Literal["logs", "exec", "port"]
    replica: Annotated[int, msgspec.Meta(ge=0, le=1023)] = 0  # which replica of a gang
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0  # kind port: the container's port (1-65535)
    command: Annotated[list[Arg], msgspec.Meta(max_length=64)] = []  # kind exec; [] runs /bin/sh
    tty: bool = False  # kind exec
    cols: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    rows: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    tail: Annotated[int, msgspec.Meta(ge=-1, le=1_000_000)] = 100  # kind logs
    follow: bool = False  # kind logs


class RenterAccess:
    """``Operations.access``: open a tunnel to a replica of a workload for its owner (or an operator)."""

    def __init__(self, master: Master, workloads: Callable[..., Awaitable[WorkloadRecord]]) -> None:
        self._master = master
        self._workload = workloads  # Operations.get_workload: 404 for another account's

    async def open(self, workload_id: str, request: TunnelRequest, *, account: str, owner: str | None) -> TunnelGrant:
        """A grant for ``account`` (the caller) to reach ``workload_id``; ``owner``: the scope (None: operator)."""
        kind = TunnelKind(request.kind)
        params = _ticket_fields(kind, request)  # a bad request is a 400 whatever the workload's state
        workload = await self._workload(workload_id, account=owner)
        if kind is TunnelKind.PORT:
            _check_declared(workload, request.port)
        assignment = _assignment(workload, request)
        opened = await self._master.tunnels.open(
            kind,
            account=account,
            workload=workload.id,
            agent_id=assignment.agent_id,
            container=assignment.container,
            **params,
        )
        body = opened.ticket.body
        return TunnelGrant(
            id=body.id,
            kind=body.kind,
            workload=workload.id,
            agent_id=body.agent_id,
            relay_id=body.relay_id,
            url=opened.url,
            ticket=encode_ticket(opened.ticket),
            ca_pem=self._master.authority.ca.chain_pem().decode(),
            expires_at=body.expires_at,
        )

    async def logs(
        self, workload_id: str, request: TunnelRequest, *, account: str, owner: str | None
    ) -> AsyncGenerator[tuple[int, bytes], None]:
        """The output of a replica, through a logs tunnel the Master itself dials: ``(STDOUT|STDERR, bytes)`` until it
        ends (or, following, until the caller stops iterating). Refusals raise before the first item."""
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


class InvalidTunnel(IdlegridError):
    """A tunnel that cannot be opened as asked (the request's fault: 400)."""

    code = "invalid_tunnel"


def _ticket_fields(kind: TunnelKind, request: TunnelRequest) -> dict[str, Any]:
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


def _assignment(workload: WorkloadRecord, request: TunnelRequest) -> Assignment:
    """The replica's container, when it is there to reach: running (logs also once it has exited)."""
    reachable = ("running", "exited") if request.kind == TunnelKind.LOGS.value else ("running",)
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
