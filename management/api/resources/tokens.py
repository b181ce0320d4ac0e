"""Join tokens (operator only): one-time, short-lived, bound to the provider account whose hosts they enroll
(an existing, enabled account of role provider)."""

from __future__ import annotations

from aiohttp import web

from management.api.audit import created
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body
from management.http.schemas import CreateToken
from management.views.grid import token_view


async def create_token(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateToken)
    issued = await request.app[SERVICES_KEY].grid.create_token(body.provider, body.ttl_s)
    created(request, body.provider)
    return json_response(token_view(issued.token, issued.record), status=201)
