"""Agents (hosts): list, show, drain, undrain, revoke. Providers see and maintain only their own hosts."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_query
from management.http.schemas import AgentQuery, EmptyQuery
from management.services.hosts import AgentDetail, AgentKey
from management.views.hosts import AgentView, agent_view
from management.views.market import completion_view

RESOURCE = "agents"


def render(detail: AgentDetail) -> AgentView:
    return agent_view(
        detail.agent,
        detail.gpus,
        detail.latest,
        reachable=detail.reachable,
        offered=detail.offered,
        workloads=detail.workloads,
        holders=detail.holders,
    )


async def list_agents(request: web.Request) -> web.Response:
    query = parse_query(request, AgentQuery)
    page = request.app[SERVICES_KEY].hosts.list_agents(
        state=query.state,
        provider=query.provider,
        region=query.region,
        tier=query.tier,
        model=query.model,
        owner=scope_of(request).owner,
        after=decode_cursor(RESOURCE, query, AgentKey),
        limit=query.limit,
    )
    return page_response(RESOURCE, query, page, render)


async def get_agent(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    detail = request.app[SERVICES_KEY].hosts.get_agent(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(render(detail))


async def get_completion(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    rate = request.app[SERVICES_KEY].market.completion(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(completion_view(rate))


async def review_completion(request: web.Request) -> web.Response:
    scope = scope_of(request)
    rate = await request.app[SERVICES_KEY].market.review_completion(request.match_info["agent_id"], by=scope.principal.account)
    return json_response(completion_view(rate))


async def drain_agent(request: web.Request) -> web.Response:
    detail = await request.app[SERVICES_KEY].hosts.drain(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(render(detail))


async def undrain_agent(request: web.Request) -> web.Response:
    detail = await request.app[SERVICES_KEY].hosts.undrain(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(render(detail))


async def revoke_agent(request: web.Request) -> web.Response:
    detail = await request.app[SERVICES_KEY].hosts.revoke(request.match_info["agent_id"])
    return json_response(render(detail))
