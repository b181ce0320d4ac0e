"""Telemetry history: a GPU's, a host's GPUs' and a workload's GPUs' rollups over a window, at a step
(management/monitoring/history.py). Who sees which is decided in auth.py: a provider its own hosts' GPUs, a renter
its own workloads."""

from __future__ import annotations

from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_query
from management.http.schemas import TelemetryQuery
from management.views.telemetry import telemetry_view


async def gpu_telemetry(request: web.Request) -> web.Response:
    query = parse_query(request, TelemetryQuery)
    history = await request.app[SERVICES_KEY].telemetry.gpu_telemetry(
        request.match_info["uuid"], from_s=query.from_, to_s=query.to, step_s=query.step, owner=scope_of(request).owner
    )
    return json_response(telemetry_view(history))


async def host_telemetry(request: web.Request) -> web.Response:
    query = parse_query(request, TelemetryQuery)
    history = await request.app[SERVICES_KEY].telemetry.host_telemetry(
        request.match_info["agent_id"], from_s=query.from_, to_s=query.to, step_s=query.step, owner=scope_of(request).owner
    )
    return json_response(telemetry_view(history))


async def workload_telemetry(request: web.Request) -> web.Response:
    query = parse_query(request, TelemetryQuery)
    history = await request.app[SERVICES_KEY].telemetry.workload_telemetry(
        request.match_info["workload_id"], from_s=query.from_, to_s=query.to, step_s=query.step, account=scope_of(request).owner
    )
    return json_response(telemetry_view(history))
