"""GPUs: the list, filtered and paged by cursor (a provider's holds only its own hosts' GPUs); an operator's repair."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_query
from management.http.schemas import EmptyQuery, GpuQuery
from management.services.hosts import GpuDetail, GpuKey
from management.views.hosts import GpuView, gpu_view

RESOURCE = "gpus"


def render(detail: GpuDetail) -> GpuView:
    return gpu_view(detail.gpu, detail.latest, offered=detail.offered, holders=detail.holders)


async def list_gpus(request: web.Request) -> web.Response:
    query = parse_query(request, GpuQuery)
    page = request.app[SERVICES_KEY].hosts.list_gpus(
        state=query.state,
        tier=query.tier,
        model=query.model,
        agent_id=query.agent_id,
        offered=query.offered,
        owner=scope_of(request).owner,
        after=decode_cursor(RESOURCE, query, GpuKey),
        limit=query.limit,
    )
    return page_response(RESOURCE, query, page, render)


async def repair_gpu(request: web.Request) -> web.Response:
    """A faulty GPU is sound again (reset, reseated, replaced): it goes back into service."""
    parse_query(request, EmptyQuery)
    detail = await request.app[SERVICES_KEY].hosts.repair_gpu(request.match_info["uuid"])
    return json_response(render(detail))
