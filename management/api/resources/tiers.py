"""Tiers: the classes GPUs are sold in, from the tier policy, best first. Any account may read them."""

from __future__ import annotations

from aiohttp import web

from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import parse_query
from management.http.schemas import PageQuery
from management.services.models import PositionKey
from management.views.hosts import TierView
from master.port import TierJson

RESOURCE = "tiers"


def render(tier: TierJson) -> TierView:
    """The policy's description of a tier (``describe_tiers``), as its answer struct."""
    return TierView(**tier)


async def list_tiers(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    page = request.app[SERVICES_KEY].grid.list_tiers(after=decode_cursor(RESOURCE, query, PositionKey), limit=query.limit)
    return page_response(RESOURCE, query, page, render)
