"""Renter access through the relays, as the façade offers it: ``RenterAccess.open`` checks who may open which
tunnel, mints the ticket (common/tunnel.py), has the Master tell the agent to dial, and answers where to connect.

Only the workload's owner (or an operator) opens a tunnel to it, only while a replica of it runs; every opening is an
audit event (``tunnel.opened``) naming the account, the workload, the kind and the port.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Arg = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
DEFAULT_SHELL = ("/bin/sh",)


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


class TunnelGrant(msgspec.Struct, kw_only=True):
    """Where and with what to connect: dial ``url`` with ``ticket`` in the X-Idlegrid-Ticket header, trusting
    ``ca_pem`` (the platform CA) for the relay's certificate, before ``expires_at``."""

    id: str
    kind: str
    workload: str
    agent_id: str
    relay_id: str
    url: str  # wss://RELAY/tunnel
    ticket: str
    ca_pem: str
    expires_at: float
