"""Measured verification (docs/verification.md): the operator starts a run on a host's GPUs; the operator and the
host's provider read each GPU's latest verification and its history of runs, each with the reason a person reads."""

from __future__ import annotations

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery
from management.views.verification import VerifyStarted, host_verifications_view


class VerifyRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gpus: list[str] = []  # the GPUs to verify, by uuid; none named: every GPU of the host


async def verify_agent(request: web.Request) -> web.Response:
    body = await parse_body(request, VerifyRequest) if request.can_read_body else VerifyRequest()
    agent_id = request.match_info["agent_id"]
    started = await request.app[SERVICES_KEY].verification.request(agent_id, body.gpus)
    return json_response(VerifyStarted(agent_id=agent_id, challenges=started), status=202)


async def agent_verifications(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    history = await request.app[SERVICES_KEY].verification.history(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(host_verifications_view(history))
