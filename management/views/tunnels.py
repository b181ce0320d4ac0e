"""A tunnel's grant (docs/tunnels.md): where to dial, with which ticket, until when."""

from __future__ import annotations

import msgspec

from management.client.tunnel import TunnelGrant
from management.views.base import Time, View, instant


class TunnelGrantView(View):
    """POST /api/v1/workloads/{id}/tunnels: dial ``url`` with ``ticket`` in the X-Idlegrid-Ticket header before
    ``expires_at``, trusting ``ca_pem`` (the platform CA) for the relay's certificate."""

    id: str
    kind: str
    workload: str
    agent_id: str
    relay_id: str
    url: str
    ticket: str
    ca_pem: str
    expires_at: Time


def tunnel_grant_view(grant: TunnelGrant) -> TunnelGrantView:
    fields = msgspec.structs.asdict(grant)
    fields["expires_at"] = instant(grant.expires_at)
    return TunnelGrantView(**fields)
