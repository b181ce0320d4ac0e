"""Each route of the API is declared once (management/api/routing.py) and the router, the authorization and the
OpenAPI document all read that declaration; an error code no table maps answers 500 with a log line, never a 4xx.

Run against the real API on a real Master (the ``api`` fixture: SQLite in the test's tmp_path).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common.errors import Conflict, IdlegridError, NotFound
from management.access_control import Action, Resource
from management.api import routing
from management.api.auth import auth_middleware
from management.api.route import DeclarationError, Route
from management.api.routing import DECLARED, ROUTES, add_routes, declared, document, undeclared
from management.app import api_app, compose
from management.http.errors import errors_middleware
from management.http.keys import SERVICES_KEY
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import api_key

# --- every route declared, every declaration whole ------------------------------------------------------------------


def test_the_app_serves_exactly_the_declared_api_routes(api):
    assert undeclared(api.app) == set()
    served = {(r.method, r.resource.canonical) for r in api.app.router.routes() if r.resource and r.method != "HEAD"}
    assert set(DECLARED) <= served, "declarations the app does not serve"


def test_a_route_registered_on_the_app_without_a_declaration_is_found(tmp_path):
    app = api_app(Master(MasterConfig(state_dir=str(tmp_path), link_port=0)))  # built, never started: routes only

    async def sneaky(request: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_get("/api/v1/sneaky", sneaky)
    app.router.add_post("/api/v1/agents/{agent_id}/poke", sneaky)
    assert undeclared(app) == {("GET", "/api/v1/sneaky"), ("POST", "/api/v1/agents/{agent_id}/poke")}


def test_every_declaration_has_a_handler_an_access_rule_and_an_answer_in_the_document():
    paths = document()["paths"]
    for route in ROUTES:
        assert inspect.iscoroutinefunction(route.handler), (route.method, route.path)
        assert route.public or (route.resource is not None and route.action is not None), route.path
        answers = paths[route.path][route.method.lower()]["responses"]
        assert any(status.startswith("2") for status in answers), (route.method, route.path)
        assert {str(status) for status in route.answers} <= set(answers)


async def _nothing(request: web.Request) -> web.Response:
    return web.json_response({})


def test_an_incomplete_or_repeated_declaration_is_refused_when_declared():
    with pytest.raises(DeclarationError, match="at least one success answer"):
        Route("GET", "/api/v1/x", _nothing, Resource.TIERS, Action.READ, "X", {}, tag="x")
    with pytest.raises(DeclarationError, match="both a resource and an action"):
        Route("GET", "/api/v1/x", _nothing, Resource.TIERS, None, "X", {200: None}, tag="x")
    first = ROUTES[0]
    with pytest.raises(DeclarationError, match="declared twice"):
        declared((*ROUTES, first))


# --- adding a route is one declaration ------------------------------------------------------------------------------


class Shout(msgspec.Struct, forbid_unknown_fields=True):
    text: str


async def shout(request: web.Request) -> web.Response:
    return web.json_response({"text": request.match_info["tier"].upper()})


SHOUT = Route(
    "GET", "/api/v1/tiers/{tier}/shout", shout, Resource.TIERS, Action.READ, "Shout a tier's name", {200: Shout}, tag="tiers"
)
SECRET = Route(
    "POST", "/api/v1/tiers/{tier}/secret", shout, Resource.TOKENS, Action.WRITE, "The operator's", {200: Shout}, tag="tiers"
)


@pytest.fixture
async def extended(api) -> AsyncIterator[TestClient]:
    """An app of the API's middlewares and routes plus two new declarations, nothing else added."""
    app = web.Application(middlewares=[errors_middleware, auth_middleware])
    app[SERVICES_KEY] = compose(api.master).services
    add_routes(app, (*ROUTES, SHOUT, SECRET))
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_one_declaration_serves_authorizes_and_describes_a_new_route(api, extended):
    renter = await api_key(api.master, "renter", "bob")
    shouted = await extended.get("/api/v1/tiers/a10/shout", headers=renter)
    assert shouted.status == 200 and await shouted.json() == {"text": "A10"}
    assert (await extended.get("/api/v1/tiers/a10/shout")).status == 401  # a key is needed, as for every route
    assert (await extended.post("/api/v1/tiers/a10/secret", headers=renter)).status == 403  # tokens: operator's
    assert (await extended.post("/api/v1/tiers/a10/secret", headers=api.auth)).status == 200
    doc = await (await extended.get("/api/v1/openapi.json")).json()
    assert doc["paths"]["/api/v1/tiers/{tier}/shout"]["get"]["summary"] == "Shout a tier's name"
    assert "Shout" in doc["components"]["schemas"]
    assert "/api/v1/tiers/{tier}/shout" not in routing.document()["paths"]  # the API's own table is untouched


# --- an error no table maps is the server's fault -------------------------------------------------------------------


class WidgetMelted(IdlegridError):
    """An error whose code no table maps: a server fault."""

    code = "widget_melted"


def _raising(exc: Exception):
    async def handler(request: web.Request) -> web.Response:
        raise exc

    return handler


@pytest.fixture
async def faulty(tmp_path) -> AsyncIterator[TestClient]:
    """The API on its own Master with four extra routes that raise (undeclared, so the operator's alone: the tests
    call with the operator's key, ``faulty.auth``)."""
    master = Master(MasterConfig(state_dir=str(tmp_path / "faulty"), link_port=0))
    await master.start()
    app = api_app(master)
    app.router.add_get("/api/v1/faults/unmapped", _raising(WidgetMelted("the widget melted")))
    app.router.add_get("/api/v1/faults/plain", _raising(RuntimeError("a bug")))
    app.router.add_get("/api/v1/faults/not-found", _raising(NotFound("no such widget")))
    app.router.add_get("/api/v1/faults/conflict", _raising(Conflict("the widget is busy")))
    async with TestClient(TestServer(app)) as client:
        client.auth = {"Authorization": f"Bearer {await master.create_api_key('faults')}"}  # type: ignore[attr-defined]
        yield client
    await master.stop()


@pytest.mark.parametrize("path", ["/api/v1/faults/unmapped", "/api/v1/faults/plain"])
async def test_an_unmapped_error_code_or_a_plain_exception_answers_500_and_is_logged(faulty, caplog, path):
    with caplog.at_level(logging.ERROR, logger="management.http.errors"):
        response = await faulty.get(path, headers=faulty.auth)
    assert response.status == 500
    body = await response.json()
    assert body["error"]["code"] == "internal"
    assert "melted" not in body["error"]["message"] and "bug" not in body["error"]["message"]  # no details leak
    records = [r for r in caplog.records if r.name == "management.http.errors"]
    assert len(records) == 1
    assert records[0].path == path and records[0].method == "GET" and records[0].exc_info is not None
    assert path in records[0].getMessage()


@pytest.mark.parametrize(
    ("path", "status", "code"), [("/api/v1/faults/not-found", 404, "not_found"), ("/api/v1/faults/conflict", 409, "conflict")]
)
async def test_a_mapped_error_keeps_its_status_and_code_and_logs_nothing(faulty, caplog, path, status, code):
    with caplog.at_level(logging.ERROR, logger="management.http.errors"):
        response = await faulty.get(path, headers=faulty.auth)
    assert response.status == status
    assert (await response.json())["error"]["code"] == code
    assert [r for r in caplog.records if r.name == "management.http.errors"] == []


async def test_a_bad_request_still_answers_400(api):
    response = await api.get("/api/v1/agents?limit=0", headers=api.auth)
    assert response.status == 400 and (await response.json())["error"]["code"] == "bad_request"
