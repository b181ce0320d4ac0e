"""The event log (operator only): every transition and refusal, in sequence order, filtered by subject and kind."""

from __future__ import annotations

from aiohttp import web

from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import parse_query
from management.http.schemas import EventQuery
from management.services.grid import SeqKey
from management.views.grid import event_view

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
