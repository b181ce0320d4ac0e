"""A renter's serverless endpoints in the console (docs/endpoints.md): the list, and each endpoint's page with its
worker spec, scaling policy, request bounds and invocation keys (made here, the key shown on the answer once and
never again; revoked after a confirmation).

Every call is limited to the signed-in account's own endpoints (``Scope.owner``; the operator's is every account's):
another account's endpoint answers 404, as a missing one does. Endpoints are made with ``idlegrid endpoint create`` or
the API; the page says how.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from aiohttp import web

from common.errors import Conflict, NotFound
from management.access_control import Action, Resource
from management.console import session
from management.console.forms import FormErrors, text
from management.console.nav import NavItem
from management.console.rendering import page
from management.endpoints.spec import EndpointKeyRecord
from management.http.keys import SERVICES_KEY
from management.market.money import format_amount
from management.services.endpoint_requests import EndpointOverview
from management.services.endpoints import MAX_KEY_NAME

__all__ = ["NAV", "add_routes", "live_view"]


@dataclass(frozen=True)
class LiveView:
    """What the page shows of an endpoint now, as text: its workers, its queue, its day's cost."""

    workers: str
    queue: str
    decision: str
    spent: str
    cost_per_request: str
    cap: str
    cold_starts: str


def live_view(o: EndpointOverview) -> LiveView:
    jobs = o.health.jobs
    if o.scale is None:
        workers, decision = "none yet: the autoscaler has not looked at this endpoint", ""
    else:
        by_phase = [f"{n} {phase}" for phase, n in sorted(o.scale.workers.items()) if n]
        workers = ", ".join(by_phase) or "none"
        decision = o.scale.why
    queued, running = jobs.get("queued", 0), jobs.get("in_progress", 0)
    waited = f", the oldest waiting {o.oldest_wait_s:.1f} s" if o.oldest_wait_s is not None else ""
    queue = f"{queued} waiting{waited}; {running} running; {o.health.busy_workers} of {o.health.workers} workers busy"
    if o.endpoint.spec.load_balanced:  # its requests are not the book's: held ones are the autoscaler's queue
        held = o.scale.waiting if o.scale is not None else 0
        queue = f"{held} held for a ready worker (the others go straight to one; their answers are not kept)"
    per = o.cost_per_request
    colds = sorted(o.scale.cold_starts) if o.scale is not None else []
    cold_starts = (
        f"median {statistics.median(colds):.2f} s, longest {colds[-1]:.2f} s, over its last {len(colds)} worker start(s)"
        if colds
        else "no worker started yet on this Master"
    )
    spec_cap = o.endpoint.spec.daily_spend_cap
    return LiveView(
        workers=workers,
        queue=queue,
        decision=decision,
        spent=format_amount(o.spent_24h),
        cost_per_request="no request completed in the last day" if per is None else format_amount(per),
        cap="none" if spec_cap is None else spec_cap,
        cold_starts=cold_starts,
    )


async def endpoints_page(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.ENDPOINTS, Action.READ)
    found = await request.app[SERVICES_KEY].endpoints.list(owner=scope.owner)
    return await page(request, "endpoints/endpoints.html", title="Endpoints", endpoints=found)


async def _endpoint_page(
    request: web.Request, action: Action, *, issued: str = "", issued_key: EndpointKeyRecord | None = None,
    errors: FormErrors | None = None, key_name: str = "",
) -> web.Response:  # fmt: skip
    scope = await session.signed_in(request, Resource.ENDPOINTS, action)
    services = request.app[SERVICES_KEY]
    overview = await services.endpoint_requests.overview(request.match_info["endpoint_id"], account=scope.owner)
    record = overview.endpoint
    keys = await services.endpoints.keys(record.id, account=scope.owner)
    errors = errors if errors is not None else FormErrors()
    return await page(
        request, "endpoints/endpoint.html", status=400 if errors else (201 if issued else 200),
        title=f"Endpoint {record.spec.name}", e=record, keys=keys, issued=issued, issued_key=issued_key, errors=errors,
        key_name=key_name, o=overview, now=live_view(overview), currency=services.market.currency,
        api_url=f"{request.scheme}://{request.host}", max_key_name=MAX_KEY_NAME, url=services.endpoints.url_of(record),
    )  # fmt: skip


async def endpoint_page(request: web.Request) -> web.Response:
    return await _endpoint_page(request, Action.READ)


async def create_key(request: web.Request) -> web.Response:
    """The key is shown on this answer alone: it is not kept in the session, and no later page can show it."""
    scope = await session.signed_in(request, Resource.ENDPOINTS, Action.WRITE)
    errors = FormErrors()
    name = text(await request.post(), "name", max_length=MAX_KEY_NAME + 1)
    if len(name) > MAX_KEY_NAME:
        errors.add("name", f"name: {MAX_KEY_NAME} characters at most")
    if errors:
        return await _endpoint_page(request, Action.WRITE, errors=errors, key_name=name)
    try:
        issued = await request.app[SERVICES_KEY].endpoints.create_key(
            request.match_info["endpoint_id"], name, account=scope.owner
        )
    except Conflict as exc:  # the endpoint holds the most keys it may
        errors.add("name", str(exc))
        return await _endpoint_page(request, Action.WRITE, errors=errors, key_name=name)
    return await _endpoint_page(request, Action.WRITE, issued=issued.key, issued_key=issued.record)


async def confirm_revoke(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.ENDPOINTS, Action.WRITE)
    endpoints = request.app[SERVICES_KEY].endpoints
    record = await endpoints.get(request.match_info["endpoint_id"], account=scope.owner)
    key = next((k for k in await endpoints.keys(record.id, account=scope.owner) if k.id == request.match_info["key_id"]), None)
    if key is None:
        raise NotFound(f"endpoint {record.id} has no invocation key {request.match_info['key_id'][:40]!r}")
    return await page(request, "endpoints/revoke.html", title=f"Revoke key {key.name}", e=record, key=key)


async def revoke_key(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.ENDPOINTS, Action.WRITE)
    endpoint_id = request.match_info["endpoint_id"]
    key = await request.app[SERVICES_KEY].endpoints.revoke_key(endpoint_id, request.match_info["key_id"], account=scope.owner)
    await session.flash(request, f"Revoked invocation key {key.name} ({key.id}): requests sent with it are refused from now on.")
    raise web.HTTPSeeOther(f"/console/endpoints/{endpoint_id}")


NAV = [NavItem("renter", "Endpoints", "/console/endpoints", order=35)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/endpoints", endpoints_page)
    router.add_get("/console/endpoints/{endpoint_id}", endpoint_page)
    router.add_post("/console/endpoints/{endpoint_id}/keys", create_key)
    router.add_get("/console/endpoints/{endpoint_id}/keys/{key_id}/revoke", confirm_revoke)
    router.add_post("/console/endpoints/{endpoint_id}/keys/{key_id}/revoke", revoke_key)
