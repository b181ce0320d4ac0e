"""Opening a tunnel (common/tunnel.py) from the Master's side: mint and sign the ticket for the relay the agent is
linked through, and tell the agent over its control link to dial that relay.

Who may open which tunnel is decided before this (management/services/tunnels.py); this only knows agents, relays and
keys. A ticket is good for ``ticket_s`` and for one meeting at one relay; nothing about it is stored but the event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from common.errors import IdlegridError
from common.tunnel import RENTER_PATH, Ticket, TicketBody, TunnelKind, new_ticket_id, sign_ticket
from common.wire import TunnelOpen, encode
from master.events import EventLog
from master.keys import SigningKeyRing
from master.link import RelayHub


class TunnelUnavailable(IdlegridError):
    """The host cannot be reached for a tunnel now: not linked, or its relay gave no address renters can reach."""

    code = "tunnel_unavailable"


@dataclass(frozen=True)
class OpenedTunnel:
    ticket: Ticket
    url: str  # wss://RELAY/tunnel: where the renter's end dials


class TunnelDispatch:
    def __init__(self, hub: RelayHub, keys: SigningKeyRing, events: EventLog, *, ticket_s: float, bytes_per_s: int = 0) -> None:
        self._hub = hub
        self._keys = keys
        self._events = events
        self._ticket_s = ticket_s
        self._bytes_per_s = bytes_per_s

    async def open(
        self,
        kind: TunnelKind,
        *,
        account: str,
        workload: str,
        agent_id: str,
        container: str,
        now: float | None = None,
        **params: Any,
    ) -> OpenedTunnel:
        """Sign a ticket for ``container`` on ``agent_id`` and send it to the agent; ``params``: the kind's fields of
        ``TicketBody`` (port; command, tty, cols, rows; tail, follow)."""
        link = self._hub.agent_links.get(agent_id)
        if link is None:
            raise TunnelUnavailable(f"host {agent_id} is not connected to any relay now; try again when it is back")
        if not link.http_url:
            raise TunnelUnavailable(
                f"relay {link.relay_id}, which carries host {agent_id}, gave no HTTPS address for renters "
                "(an older relay, or one without http_public_url): upgrade or configure it"
            )
        now = time.time() if now is None else now
        signer = self._keys.current
        body = TicketBody(
            id=new_ticket_id(),
            kind=kind.value,
            account=account,
            workload=workload,
            agent_id=agent_id,
            container=container,
            relay_id=link.relay_id,
            issued_at=now,
            expires_at=now + self._ticket_s,
            key_id=signer.key_id,
            bytes_per_s=self._bytes_per_s,
            **params,
        )
        ticket = sign_ticket(body, signer, self._keys.key_endorsements()[signer.key_id])
        if not await link.send_to_agent(agent_id, encode(TunnelOpen(ticket=ticket))):
            raise TunnelUnavailable(f"the link to relay {link.relay_id} closed while telling host {agent_id}; try again")
        await self._events.record(
            "tunnel.opened",
            workload,
            ticket=body.id,
            kind=body.kind,
            account=account,
            agent_id=agent_id,
            relay=link.relay_id,
            port=body.port,
            command=list(body.command),
        )
        return OpenedTunnel(ticket, _tunnel_url(link.http_url))


def _tunnel_url(http_url: str) -> str:
    base = http_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + RENTER_PATH
