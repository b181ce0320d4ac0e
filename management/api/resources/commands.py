"""Raw container commands (operator only): create, show, list newest first."""

from __future__ import annotations

from aiohttp import web

from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import CommandQuery, CommandWaitQuery, CreateCommand
from management.services.grid import CommandKey
from management.views.grid import command_accepted_view, command_view

RESOURCE = "commands"


async def create_command(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateCommand)
    record = await request.app[SERVICES_KEY].grid.create_command(body.agent_id, body.kind, body.spec, timeout_s=body.timeout_s)
    return json_response(command_accepted_view(record), status=202)


async def get_command(request: web.Request) -> web.Response:
    query = parse_query(request, CommandWaitQuery)
    record = await request.app[SERVICES_KEY].grid.get_command(request.match_info["command_id"], wait_s=query.wait_s)
    return json_response(command_view(record))


async def list_commands(request: web.Request) -> web.Response:
    query = parse_query(request, CommandQuery)
    page = await request.app[SERVICES_KEY].grid.list_commands(
        agent_id=query.agent_id, states=query.state, after=decode_cursor(RESOURCE, query, CommandKey), limit=query.limit
    )
    return page_response(RESOURCE, query, page, command_view)
