"""The event log (operator only): every transition and refusal, in sequence order, filtered by subject and kind."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import SERVICES_KEY
from management.api.errors import BadRequest
from management.api.paging import decode_cursor, page_response
from management.api.requests import parse_query
from management.api.schemas import EventQuery
from management.services.grid import SeqKey
from management.views import event_view

RESOURCE = "events"


async def list_events(request: web.Request) -> web.Response:
    query = parse_query(request, EventQuery)
    key = decode_cursor(RESOURCE, query, SeqKey)
    if key is not None and query.after is not None:
        raise BadRequest("give either after (where to start) or cursor (where the last page ended), not both")
    after_seq = key.seq if key is not None else query.after or 0
    page = await request.app[SERVICES_KEY].grid.list_events(
        subject=query.subject, kind=query.kind, after_seq=after_seq, limit=query.limit
    )
    return page_response(RESOURCE, query, page, event_view)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/v1/events", list_events)
