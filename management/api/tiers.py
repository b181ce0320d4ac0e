"""Tiers: the classes GPUs are sold in, from the tier policy, best first. Any account may read them."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from management.api.auth import SERVICES_KEY
from management.api.paging import decode_cursor, page_response
from management.api.requests import parse_query
from management.api.schemas import PageQuery
from management.services.models import PositionKey

RESOURCE = "tiers"


def render(tier: dict[str, Any]) -> dict[str, Any]:
    return tier


async def list_tiers(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    page = request.app[SERVICES_KEY].grid.list_tiers(after=decode_cursor(RESOURCE, query, PositionKey), limit=query.limit)
    return page_response(RESOURCE, query, page, render)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/v1/tiers", list_tiers)
