"""The API described: an OpenAPI 3.1 document built from the routes' declarations (management/api/routing.py).

Each ``Route`` (management/api/route.py) gives its method and path (as the router has them), a summary, a tag, the
structs of its body, its query and each success answer, and the error statuses it may answer beyond those every
authenticated route may (``COMMON_ERRORS``; 404 is added for a path with parameters, 413 for a body).
``build_document`` turns the structs into JSON Schema 2020-12 with ``msgspec.json.schema_components`` (what OpenAPI
3.1 uses), a list query's fields into query parameters, a path's ``{name}`` into path parameters, and every error into
the one ``Error`` schema (management/http/errors.py). The document is built from the same declarations the router and
the authorization read, so a served route cannot go undescribed.

Served at ``GET /api/v1/openapi.json`` and read by the reference page (``GET /api/v1/docs``, management/api/reference.py);
both are public (declared with no resource), like the document of any public API.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from aiohttp import web

from management.api.route import COMMON_ERRORS, JSON, PUBLIC_ERRORS, Route
from management.http import schemas
from management.http.schemas import OpenApiJson
from management.views.errors import Error

OPENAPI_PATH = "/api/v1/openapi.json"
REF = "#/components/schemas/{name}"
ERROR_SAID = {
    400: "Bad request: the message names the field",
    401: "No API key, or one that is unknown or revoked",
    402: "The balance does not cover it",
    403: "The caller's role may not do this, or its account is disabled",
    404: "No such resource (or another account's: existence is not leaked)",
    409: "Conflicts with the resource's state",
    413: "The body is larger than the API accepts",
    429: "This API key is over its rate limit; retry after Retry-After seconds",
    503: "The Master is shutting down; retry after Retry-After seconds",
}

# 429 (ratelimit.py) and 503 (server.ApiGate) say when to try again: whole seconds, at least 1.
RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRY_AFTER = {
    "description": "Seconds to wait before trying again",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}


class PublishedDocument:
    """The document an app serves, built once from its declared routes: the dict, and its JSON encoded once."""

    def __init__(self, document: OpenApiJson) -> None:
        self.document = document
        self.json = msgspec.json.encode(document)


DOCUMENT_KEY = web.AppKey("openapi_document", PublishedDocument)


def _without_null(schema: OpenApiJson) -> OpenApiJson:
    """A query parameter's schema: an absent parameter is the null, so ``X | None`` is ``X`` (and no null default)."""
    schema = {k: v for k, v in schema.items() if not (k == "default" and v is None)}
    options = [s for s in schema.get("anyOf", ()) if s != {"type": "null"}]
    if "anyOf" in schema and len(options) == 1:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**options[0], **rest}
    if "anyOf" in schema:
        schema["anyOf"] = options
    return schema


def _query_parameters(query: type[msgspec.Struct], components: OpenApiJson) -> list[OpenApiJson]:
    struct = components[query.__name__]
    required = set(struct.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": _without_null(schema)}
        for name, schema in struct.get("properties", {}).items()
    ]


def _path_parameters(op: Route) -> list[OpenApiJson]:
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in op.path_parameters
    ]


def _ref(struct: type[msgspec.Struct]) -> dict[str, str]:
    return {"$ref": REF.format(name=struct.__name__)}


def _answer_content(op: Route, struct: type[msgspec.Struct] | None) -> OpenApiJson:
    content = {}
    for media in op.media:
        if media == JSON:
            content[media] = {"schema": _ref(struct) if struct is not None else {"type": "object"}}
        else:
            content[media] = {"schema": {"type": "string"}}
    return content


def _operation(op: Route, components: OpenApiJson) -> OpenApiJson:
    answers: OpenApiJson = {
        str(status): {"description": op.summary, "content": _answer_content(op, struct)} for status, struct in op.answers.items()
    }
    for status in op.error_statuses:
        answers[str(status)] = {"description": ERROR_SAID.get(status, "Refused"), "content": {JSON: {"schema": _ref(Error)}}}
        if status in RETRY_AFTER_STATUSES:
            answers[str(status)]["headers"] = {"Retry-After": RETRY_AFTER}
    doc: OpenApiJson = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": _path_parameters(op) + (_query_parameters(op.query, components) if op.query is not None else []),
        "responses": answers,
    }
    if op.description:
        doc["description"] = op.description
    if op.body is not None:
        doc["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(op.body)}}}
    if op.public:
        doc["security"] = []
    return doc


def _structs(operations: Sequence[Route]) -> list[type[msgspec.Struct]]:
    named: dict[str, type[msgspec.Struct]] = {"Error": Error}
    for op in operations:
        for struct in (op.body, op.query, *op.answers.values()):
            if struct is not None:
                named.setdefault(struct.__name__, struct)
    return list(named.values())


def build_document(operations: Sequence[Route], *, version: str = "1") -> OpenApiJson:
    """The OpenAPI 3.1 document of ``operations``."""
    _, components = msgspec.json.schema_components(_structs(operations), ref_template=REF)
    # A struct's default written as a tuple (``= ()``) comes back as a Python tuple: through JSON it is the array
    # the schema says it is.
    components = schemas.ecma_patterns(msgspec.json.decode(msgspec.json.encode(components)))
    paths: dict[str, OpenApiJson] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "idlegrid management API",
            "version": version,
            "description": "The Master's management API: hosts, GPUs, workloads, accounts and the market (docs/api.md).",
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "tags": [{"name": tag} for tag in dict.fromkeys(op.tag for op in operations)],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An API key: 'Authorization: Bearer <key>'"}
            },
        },
    }


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=request.app[DOCUMENT_KEY].json, content_type=JSON)


__all__ = [
    "COMMON_ERRORS",
    "DOCUMENT_KEY",
    "PUBLIC_ERRORS",
    "OPENAPI_PATH",
    "PublishedDocument",
    "build_document",
    "openapi_json",
]
