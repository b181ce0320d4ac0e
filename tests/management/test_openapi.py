"""The OpenAPI document (management/api/openapi.py) and the reference page (management/api/reference.py).

The document describes every route the app serves under /api/ and nothing else (it is built from the routes'
declarations in management/api/routing.py, which the router reads too), is a valid OpenAPI 3.1 document by
openapi-spec-validator, and is served, like the page rendered from it, without a key.
"""

from __future__ import annotations

import re

import msgspec
from openapi_spec_validator import validate

from management.api.openapi import build_document
from management.api.reference import render
from management.api.resources import alerts, billing, disputes, endpoints, market, tunnels
from management.api.route import Route
from management.api.routing import DECLARED, ROUTES, document
from management.http import schemas
from tests.management.hosts import api_key


def app_routes(app) -> set[tuple[str, str]]:
    """Every (method, path) the app serves under /api/ (aiohttp's HEAD twins of GET routes left out)."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/api/") and route.method != "HEAD"
    }


def test_every_route_of_the_app_is_in_the_document_and_every_operation_is_a_route(api):
    described = {(path, method.upper()) for path, item in document()["paths"].items() for method in item}
    served = {(path, method) for method, path in app_routes(api.app)}
    assert served - described == set(), "routes without a description: declare them in management/api/routing.py"
    assert described - served == set(), "operations the app does not serve"
    assert len(described) == len(ROUTES), "an operation is described twice"


def test_the_document_is_valid_openapi_3_1():
    doc = document()
    assert doc["openapi"] == "3.1.0"
    validate(doc)  # raises OpenAPIValidationError naming what is wrong


def test_a_document_with_a_broken_reference_is_refused_by_the_validator():
    """The validator is not a formality: a schema reference to nothing is caught."""
    doc = build_document(ROUTES)
    doc["paths"]["/api/v1/whoami"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] = {
        "$ref": "#/components/schemas/NoSuchThing"
    }
    try:
        validate(doc)
    except Exception as exc:  # openapi-spec-validator's own error classes
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("a dangling $ref passed validation")


def test_every_request_schema_is_in_the_document():
    components = document()["components"]["schemas"]
    for struct in (
        *schemas.REQUEST_SCHEMAS,
        *market.REQUEST_SCHEMAS,
        *tunnels.REQUEST_SCHEMAS,
        *alerts.REQUEST_SCHEMAS,
        *endpoints.REQUEST_SCHEMAS,
        *billing.REQUEST_SCHEMAS,
        *disputes.REQUEST_SCHEMAS,
    ):
        assert struct.__name__ in components, f"{struct.__name__} is a request schema the document does not state"
    assert set(schemas.json_schemas()) <= set(components)


def test_each_operation_states_its_answers_and_the_errors_it_may_answer():
    paths = document()["paths"]
    for op in ROUTES:
        answers = paths[op.path][op.method.lower()]["responses"]
        for status in op.answers:
            assert str(status) in answers
        expected = {"503"} if op.public else {"400", "401", "403", "429", "503"}
        if "{" in op.path:
            expected.add("404")
        if op.body is not None:
            expected.add("413")
        assert expected <= set(answers), (op.method, op.path)
        for status in op.error_statuses:
            assert answers[str(status)]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        assert answers["503"]["headers"]["Retry-After"]["required"] is True


def test_a_query_struct_becomes_query_parameters_without_the_null_of_an_absent_one():
    parameters = document()["paths"]["/api/v1/commands"]["get"]["parameters"]
    by_name = {p["name"]: p for p in parameters}
    assert set(by_name) == {"limit", "cursor", "agent_id", "state"}
    assert by_name["state"]["schema"]["type"] == "array"  # repeatable: ?state=pending&state=sent
    assert by_name["state"]["schema"]["items"]["enum"] == list(schemas.COMMAND_STATES)  # so generated filters can be valid
    assert by_name["agent_id"]["schema"]["type"] == "string" and "anyOf" not in by_name["agent_id"]["schema"]
    assert by_name["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    path = document()["paths"]["/api/v1/agents/{agent_id}/price"]["put"]
    assert path["parameters"][0] == {
        "name": "agent_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    }
    assert path["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SetPrice"}


def test_a_new_route_is_described_by_one_entry():
    class Shout(msgspec.Struct, forbid_unknown_fields=True):
        text: str

    async def shout(request):
        raise AssertionError("never called: only the document is built")

    op = Route(
        "POST", "/api/v1/things/{thing_id}/shout", shout, None, None, "Shout at a thing", {200: Shout}, tag="things", body=Shout
    )
    doc = build_document((*ROUTES, op))
    validate(doc)
    described = doc["paths"]["/api/v1/things/{thing_id}/shout"]["post"]
    assert described["operationId"] == "post_things_thing_id_shout"
    assert {"200", "404", "413"} <= set(described["responses"]) and "Shout" in doc["components"]["schemas"]


async def test_the_document_and_the_reference_page_are_served_without_a_key(api):
    response = await api.get("/api/v1/openapi.json")
    assert response.status == 200 and response.content_type == "application/json"
    assert await response.json() == msgspec.json.decode(msgspec.json.encode(document()))
    page = await api.get("/api/v1/docs")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    for op in ROUTES:
        assert f'id="{op.operation_id}"' in html, op.path
    assert {key for key, op in DECLARED.items() if op.public} == {
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/api/v1/docs"),
        ("POST", "/api/v1/billing/webhook"),  # the payment provider's: its signature is its credential
    }


async def test_every_other_route_still_needs_a_key(api):
    response = await api.get("/api/v1/agents")
    assert response.status == 401
    renter = await api_key(api.master, "renter", "bob")
    assert (await api.get("/api/v1/openapi.json", headers=renter)).status == 200  # a key is not refused either
    assert (await api.get("/api/v1/agents", headers=renter)).status == 403


def test_the_reference_page_lists_operations_by_tag_with_parameters_bodies_and_answers():
    html = render(document())
    workloads = html.index('<h2 id="tag-workloads">')
    assert workloads < html.index('<span class="path">/api/v1/workloads/{workload_id}/cancel</span>')
    assert "<code>state</code>" in html and 'Body: application/json: <a href="#schema-SubmitWorkload">' in html
    assert '<section id="schema-WorkloadView">' in html and "<script" not in html


def test_the_reference_page_escapes_what_the_document_says():
    doc = build_document(ROUTES)
    doc["paths"]["/api/v1/whoami"]["get"]["summary"] = "<script>alert(1)</script>"
    html = render(doc)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_a_body_over_the_limit_answers_the_documented_413_in_the_error_shape(api):
    """schemathesis found this undocumented: a body larger than ApiSettings.max_body_bytes answers 413."""
    spec = {"name": "big", "image": "busybox", "command": ["x" * 1000] * 300, "account": "bob"}
    response = await api.post("/api/v1/workloads", json=spec, headers=api.auth)
    assert response.status == 413
    assert re.fullmatch(r"[a-z_]+", (await response.json())["error"]["code"])
    assert "413" in document()["paths"]["/api/v1/workloads"]["post"]["responses"]


async def test_a_provider_filtering_prices_by_another_provider_gets_the_documented_404(api):
    """schemathesis (with a provider's key) found this answer undocumented: existence is not leaked, so it is 404."""
    acme = await api_key(api.master, "provider", "acme")
    response = await api.get("/api/v1/prices?provider=zed", headers=acme)
    assert (response.status, (await response.json())["error"]["code"]) == (404, "not_found")
    assert "404" in document()["paths"]["/api/v1/prices"]["get"]["responses"]


async def test_a_key_for_a_disabled_account_gets_the_documented_409(api):
    """schemathesis found this answer undocumented, after one of its PATCHes had disabled the account."""
    await api_key(api.master, "renter", "bob")
    assert (await api.patch("/api/v1/accounts/bob", json={"disabled": True}, headers=api.auth)).status == 200
    response = await api.post("/api/v1/accounts/bob/keys", json={"name": "ci"}, headers=api.auth)
    assert (response.status, (await response.json())["error"]["code"]) == (409, "conflict")
    assert "409" in document()["paths"]["/api/v1/accounts/{account_id}/keys"]["post"]["responses"]
