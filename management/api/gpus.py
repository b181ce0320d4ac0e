"""GPUs: the list, filtered and paged by cursor. A provider's list holds only its own hosts' GPUs."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import OPERATIONS_KEY, scope_of
from management.api.paging import decode_cursor, page_response
from management.api.requests import parse_query
from management.api.schemas import GpuQuery
from management.operations import GpuDetail, GpuKey
from management.views import gpu_view

RESOURCE = "gpus"


def render(detail: GpuDetail) -> dict:
    return gpu_view(detail.gpu, detail.latest, offered=detail.offered)


async def list_gpus(request: web.Request) -> web.Response:
    query = parse_query(request, GpuQuery)
    page = request.app[OPERATIONS_KEY].list_gpus(
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


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/v1/gpus", list_gpus)
