"""Renter access: open a tunnel to a workload's container (logs, exec, a port), and its logs over plain HTTP.

``POST /api/v1/workloads/{id}/tunnels`` answers where to connect and the ticket to show there (the CLI dials the
relay itself); ``GET /api/v1/workloads/{id}/logs`` has the Master dial the tunnel and stream the output as text, for
clients that only speak HTTP; once the container is deleted (or for an earlier ``attempt``), the output the Master kept
(management/services/outputs.py). Only the workload's owner (and an operator) may do either; another's answers 404.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.services.tunnels import TunnelRequest
from management.views.tunnels import tunnel_grant_view


class LogsQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /api/v1/workloads/{id}/logs: the last ``tail`` lines (-1: all), then more while ``follow``."""

    tail: Annotated[int, msgspec.Meta(ge=-1, le=1_000_000)] = 100
    follow: bool = False
    replica: Annotated[int, msgspec.Meta(ge=0, le=1023)] = 0
    # which attempt's output (one per time the workload was placed); none: the live container's, else the latest kept
    attempt: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (TunnelRequest, LogsQuery)


async def open_tunnel(request: web.Request) -> web.Response:
    body = await parse_body(request, TunnelRequest)
    scope = scope_of(request)
    grant = await request.app[SERVICES_KEY].tunnels.open(
        request.match_info["workload_id"], body, account=scope.principal.account, owner=scope.owner
    )
    return json_response(tunnel_grant_view(grant), status=201)


async def workload_logs(request: web.Request) -> web.StreamResponse:
    query = parse_query(request, LogsQuery)
    scope = scope_of(request)
    output = request.app[SERVICES_KEY].tunnels.logs(
        request.match_info["workload_id"],
        TunnelRequest(kind="logs", tail=query.tail, follow=query.follow, replica=query.replica),
        account=scope.principal.account,
        owner=scope.owner,
        attempt=query.attempt,
    )
    first = await anext(output, None)  # a refusal (404, 409, 503) is still a JSON error, before any byte is sent
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"})
    await response.prepare(request)
    try:
        while first is not None:
            await response.write(first[1])
            first = await anext(output, None)
    finally:
        await output.aclose()
    await response.write_eof()
    return response
