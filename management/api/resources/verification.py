"""Measured verification (docs/verification.md): the operator starts a run on a host's GPUs; the operator and the
host's provider read each GPU's latest verification and its history of runs, each with the reason a person reads."""

from __future__ import annotations

import msgspec
from aiohttp import web

from common.wire import BenchmarkFigures
from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.responses import GpuVerificationView, Time, View
from management.http.schemas import EmptyQuery


class VerifyRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gpus: list[str] = []  # the GPUs to verify, by uuid; none named: every GPU of the host


class VerifyStarted(View):
    agent_id: str
    challenges: list[str]  # the challenges sent now; a GPU already being verified is not asked twice


class VerificationRunView(View):
    challenge_id: str
    status: str  # "verified" | "failed" | "refused"
    code: str
    reason: str
    at: Time
    commit_s: float | None
    challenge_tflops: float | None
    figures: BenchmarkFigures | None


class GpuVerificationsView(View):
    uuid: str
    model: str
    verification: GpuVerificationView
    runs: list[VerificationRunView]  # newest first


class HostVerificationsView(View):
    agent_id: str
    gpus: list[GpuVerificationsView]


async def verify_agent(request: web.Request) -> web.Response:
    body = await parse_body(request, VerifyRequest) if request.can_read_body else VerifyRequest()
    started = await request.app[SERVICES_KEY].verification.request(request.match_info["agent_id"], body.gpus)
    return json_response(started, status=202)


async def agent_verifications(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    history = await request.app[SERVICES_KEY].verification.history(request.match_info["agent_id"], owner=scope_of(request).owner)
    return json_response(history)
