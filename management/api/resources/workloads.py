"""Workloads: submit, list, show, cancel. A renter sees and cancels only its own; another's answers 404."""

from __future__ import annotations

from aiohttp import web

from management.access_control import acting_account
from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery, SubmitWorkload, WorkloadQuery
from management.services.workloads import WorkloadKey
from management.views.workloads import explanation_view, workload_detail, workload_view

RESOURCE = "workloads"


async def submit_workload(request: web.Request) -> web.Response:
    body = await parse_body(request, SubmitWorkload)
    account = acting_account(scope_of(request), body.account)
    services = request.app[SERVICES_KEY]
    record = await services.workloads.submit_workload(account, body.spec())
    return json_response(workload_view(record, services.market.workload_terms(record)), status=201)


async def list_workloads(request: web.Request) -> web.Response:
    query = parse_query(request, WorkloadQuery)
    page = await request.app[SERVICES_KEY].workloads.list_workloads(
        account=query.account,
        states=query.state,
        owner=scope_of(request).owner,
        after=decode_cursor(RESOURCE, query, WorkloadKey),
        limit=query.limit,
    )
    services = request.app[SERVICES_KEY]
    return page_response(RESOURCE, query, page, lambda record: workload_view(record, services.market.workload_terms(record)))


async def get_workload(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    services = request.app[SERVICES_KEY]
    record, waiting = await services.workloads.workload_and_wait(
        request.match_info["workload_id"], account=scope_of(request).owner
    )
    outputs = await services.workloads.workload_outputs(record.id)
    paths = services.workloads.network_paths(record)
    storage = await services.workloads.workload_storage(record)
    terms = services.market.workload_terms(record)
    return json_response(workload_detail(record, terms, waiting, outputs, paths, storage=storage))


async def explain_workload(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    services = request.app[SERVICES_KEY]
    explanation = await services.workloads.explain_workload(request.match_info["workload_id"], account=scope_of(request).owner)
    return json_response(explanation_view(explanation))


async def cancel_workload(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    record = await services.workloads.cancel_workload(request.match_info["workload_id"], account=scope_of(request).owner)
    return json_response(workload_view(record, services.market.workload_terms(record)))
