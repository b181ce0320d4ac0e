"""Reports along dimensions: ``GET /api/v1/reports/{kind}?by=provider,day&from=&to=&format=json|csv``.

``kind``: usage, revenue, reliability or summary (management/monitoring/reports.py says what each figure is and where
it comes from). A provider's report has its own hosts' rows, a renter's its own rentals'; the operator's every row.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import msgspec
from aiohttp import web

from management.access_control import report_owners
from management.api.auth import scope_of
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_query
from management.monitoring.report_render import report_csv
from management.monitoring.reports import KINDS, InvalidReport, parse_dimensions, parse_instant, window
from management.views.reports import report_view

InstantText = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]


class ReportQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``by``: one to three dimensions, comma-separated (provider, host, tier, model, region, renter, workload, and one
    of day, week, month); ``from``/``to``: unix seconds or ISO dates or times (UTC), the last week by default."""

    by: Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[a-z, ]+\Z")]
    start: InstantText | None = msgspec.field(default=None, name="from")
    end: InstantText | None = msgspec.field(default=None, name="to")
    format: Literal["json", "csv"] = "json"


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (ReportQuery,)


async def get_report(request: web.Request) -> web.Response:
    query = parse_query(request, ReportQuery)
    kind = request.match_info["kind"]
    try:
        if kind not in KINDS:
            raise InvalidReport(f"kind: {kind!r} is not a report; use one of {', '.join(KINDS)}")
        by = parse_dimensions(query.by)
        start = parse_instant("from", query.start) if query.start is not None else None
        end = parse_instant("to", query.end) if query.end is not None else None
        start, end = window(start, end, time.time())
    except InvalidReport as exc:
        raise BadRequest(str(exc)) from None
    provider, renter = report_owners(scope_of(request))
    report, currency = await request.app[SERVICES_KEY].reports.report(kind, by, start, end, provider=provider, renter=renter)
    if query.format == "csv":
        name = f"report-{kind}-{'-'.join(by)}.csv"
        return web.Response(
            text=report_csv(report), content_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{name}"'}
        )
    return json_response(report_view(report, currency))
