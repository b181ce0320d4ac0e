"""HTTPS links to a workload's http ports (docs/links.md): ``GET /api/v1/workloads/{id}/links`` lists them with their
URLs, ``POST /api/v1/workloads/{id}/links/{port}/tokens`` mints a link token (a bearer secret for that one link, shown
once). Only the workload's owner (and an operator) may do either; another account's workload answers 404.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body
from management.services.links import InvalidLink
from management.views.links import link_list_view, minted_token_view


class MintLinkToken(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/workloads/{id}/links/{port}/tokens: how long the token lasts (default: the browser token's time)."""

    ttl_s: Annotated[float, msgspec.Meta(gt=0)] | None = None


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (MintLinkToken,)


async def list_links(request: web.Request) -> web.Response:
    scope = scope_of(request)
    items = await request.app[SERVICES_KEY].links.list_links(request.match_info["workload_id"], owner=scope.owner)
    return json_response(link_list_view(items))


async def mint_token(request: web.Request) -> web.Response:
    body = await parse_body(request, MintLinkToken) if request.can_read_body else MintLinkToken()
    scope = scope_of(request)
    text = request.match_info["port"]
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidLink(f"port: {text!r} is not a port number (1 to 65535)")
    minted = await request.app[SERVICES_KEY].links.mint(
        request.match_info["workload_id"], int(text), account=scope.principal.account, owner=scope.owner, ttl_s=body.ttl_s
    )
    return json_response(minted_token_view(minted), status=201)
