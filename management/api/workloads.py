"""Workloads: submit, list, show, cancel. A renter sees and cancels only its own; another's answers 404."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import SERVICES_KEY, acting_account, scope_of
from management.api.paging import decode_cursor, page_response
from management.api.requests import json_response, parse_body, parse_query
from management.api.schemas import EmptyQuery, SubmitWorkload, WorkloadQuery
from management.services.workloads import WorkloadKey
from management.views import explanation_view, output_view, workload_view

RESOURCE = "workloads"


async def submit_workload(request: web.Request) -> web.Response:
    body = await parse_body(request, SubmitWorkload)
    account = acting_account(scope_of(request), body.account)
    operations = request.app[SERVICES_KEY]
    record = await operations.workloads.submit_workload(account, body.spec())
    return json_response(workload_view(record, operations.market.workload_terms(record)), status=201)


async def list_workloads(request: web.Request) -> web.Response:
    query = parse_query(request, WorkloadQuery)
    page = await request.app[SERVICES_KEY].workloads.list_workloads(
        account=query.account,
        states=query.state,
        owner=scope_of(request).owner,
        after=decode_cursor(RESOURCE, query, WorkloadKey),
        limit=query.limit,
    )
    operations = request.app[SERVICES_KEY]
    return page_response(RESOURCE, query, page, lambda record: workload_view(record, operations.market.workload_terms(record)))


async def get_workload(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    operations = request.app[SERVICES_KEY]
    record, waiting = await operations.workloads.workload_and_wait(
        request.match_info["workload_id"], account=scope_of(request).owner
    )
    view = workload_view(record, operations.market.workload_terms(record))
    view["waiting"] = explanation_view(waiting) if waiting is not None else None
    view["outputs"] = [output_view(kept) for kept in await operations.workloads.workload_outputs(record.id)]
    return json_response(view)


async def explain_workload(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    operations = request.app[SERVICES_KEY]
    explanation = await operations.workloads.explain_workload(request.match_info["workload_id"], account=scope_of(request).owner)
    return json_response(explanation_view(explanation))


async def cancel_workload(request: web.Request) -> web.Response:
    operations = request.app[SERVICES_KEY]
    record = await operations.workloads.cancel_workload(request.match_info["workload_id"], account=scope_of(request).owner)
    return json_response(workload_view(record, operations.market.workload_terms(record)))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/api/v1/workloads", submit_workload)
    router.add_get("/api/v1/workloads", list_workloads)
    router.add_get("/api/v1/workloads/{workload_id}", get_workload)
    router.add_get("/api/v1/workloads/{workload_id}/explain", explain_workload)
    router.add_post("/api/v1/workloads/{workload_id}/cancel", cancel_workload)
