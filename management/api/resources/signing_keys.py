"""Command-signing keys (operator only): list, rotate, retire. Only public halves are ever shown."""

from __future__ import annotations

from aiohttp import web

from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_query
from management.http.schemas import PageQuery
from management.services.models import PositionKey
from management.views.grid import signing_key_view

RESOURCE = "signing_keys"


async def list_signing_keys(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    page = request.app[SERVICES_KEY].grid.list_signing_keys(after=decode_cursor(RESOURCE, query, PositionKey), limit=query.limit)
    return page_response(RESOURCE, query, page, signing_key_view)


async def rotate_signing_key(request: web.Request) -> web.Response:
    return json_response(signing_key_view(await request.app[SERVICES_KEY].grid.rotate_signing_key()), status=201)


async def retire_signing_key(request: web.Request) -> web.Response:
    return json_response(signing_key_view(await request.app[SERVICES_KEY].grid.retire_signing_key(request.match_info["key_id"])))
