"""The API described: an OpenAPI 3.1 document built from one table of operations and the msgspec structs they name.

``OPERATIONS`` holds one ``Operation`` per route under ``/api/``: its method and path (as the router has them), a
summary, a tag, the structs of its body, its query and each success answer, and the error statuses it may answer
beyond those every authenticated route may (``COMMON_ERRORS``; 404 is added for a path with parameters, 413 for a
body). The document
(``document()``) turns the structs into JSON Schema 2020-12 with ``msgspec.json.schema_components`` (what OpenAPI 3.1
uses), a list query's fields into query parameters, a path's ``{name}`` into path parameters, and every error into the
one ``Error`` schema (management/api/errors.py). A test holds the table and the app's router to each other: a route
added without an entry here, or an entry without a route, fails the suite.

Served at ``GET /api/v1/openapi.json`` and read by the reference page (``GET /api/v1/docs``, management/api/reference.py);
both are public (auth.PUBLIC_ROUTES), like the document of any public API.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from management.api import alerts, market, responses, schemas, tunnels, verification
from management.api import reports as reports_api
from management.api.responses import Error
from management.renter_access import TunnelRequest

JSON = "application/json"
OPENAPI_PATH = "/api/v1/openapi.json"
REF = "#/components/schemas/{name}"
# What every authenticated route may answer besides its own: a bad query or body (or a Master refusal without a
# status of its own), no or a bad key, a role that may not, a key over its rate limit, a Master that is stopping.
COMMON_ERRORS = frozenset({400, 401, 403, 429, 503})
PUBLIC_ERRORS = frozenset({503})
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


@dataclass(frozen=True)
class Operation:
    """One route as the document states it. ``answers``: success status -> the struct of its JSON body (None: a body
    the document does not model: ``{"type": "object"}`` for JSON, a string for other media). ``media``: the answer's
    content types (the struct describes the JSON one). ``errors``: statuses beyond ``COMMON_ERRORS`` (and 404 for a
    path with parameters). ``public``: served without a key (auth.PUBLIC_ROUTES)."""

    method: str
    path: str
    summary: str
    tag: str
    answers: Mapping[int, type[msgspec.Struct] | None]
    body: type[msgspec.Struct] | None = None
    query: type[msgspec.Struct] | None = None
    errors: frozenset[int] = frozenset()
    media: tuple[str, ...] = (JSON,)
    public: bool = False
    description: str = ""

    @property
    def operation_id(self) -> str:
        words = re.sub(r"[{}]", "", self.path.removeprefix("/api/v1/")).replace("-", "_").replace(".", "_").split("/")
        return "_".join([self.method.lower(), *words])

    @property
    def path_parameters(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)

    @property
    def error_statuses(self) -> list[int]:
        statuses = set(PUBLIC_ERRORS if self.public else COMMON_ERRORS) | self.errors
        if self.path_parameters:
            statuses.add(404)
        if self.body is not None:
            statuses.add(413)  # a body over ApiSettings.max_body_bytes
        return sorted(statuses)


r = responses
# The table. Adding a route's description is one entry, in its tag's block: Operation(method, path, summary, tag,
# {status: answer struct}, body=..., query=..., errors=frozenset({409, ...})).
OPERATIONS: tuple[Operation, ...] = (
    # --- the document itself
    Operation("GET", OPENAPI_PATH, "This OpenAPI 3.1 document", "docs", {200: None}, public=True),
    Operation(
        "GET",
        "/api/v1/docs",
        "The API reference page (HTML, from this document)",
        "docs",
        {200: None},
        media=("text/html",),
        public=True,
    ),
    # --- hosts and GPUs
    Operation("GET", "/api/v1/agents", "Hosts, by id", "agents", {200: r.AgentPage}, query=schemas.AgentQuery),
    Operation(
        "GET",
        "/api/v1/agents/{agent_id}",
        "One host with its GPUs, reputation and workloads",
        "agents",
        {200: r.AgentView},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "POST",
        "/api/v1/agents/{agent_id}/drain",
        "Take a host into maintenance: no new work",
        "agents",
        {200: r.AgentView},
        errors=frozenset({409}),
    ),
    Operation(
        "POST",
        "/api/v1/agents/{agent_id}/undrain",
        "Bring a drained host back to work",
        "agents",
        {200: r.AgentView},
        errors=frozenset({409}),
    ),
    Operation(
        "POST",
        "/api/v1/agents/{agent_id}/revoke",
        "Revoke a host's certificates on every relay",
        "agents",
        {200: r.AgentView},
        errors=frozenset({409}),
    ),
    Operation("GET", "/api/v1/gpus", "GPUs, by host and index", "gpus", {200: r.GpuPage}, query=schemas.GpuQuery),
    Operation(
        "POST",
        "/api/v1/gpus/{uuid}/repair",
        "Put a faulty GPU back in service",
        "gpus",
        {200: r.GpuView},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),
    ),
    Operation(
        "GET", "/api/v1/tiers", "The tiers GPUs are sold in, best first", "tiers", {200: r.TierPage}, query=schemas.PageQuery
    ),
    # --- measured verification (docs/verification.md)
    Operation(
        "POST",
        "/api/v1/agents/{agent_id}/verify",
        "Benchmark a host's GPUs now, with a fresh challenge",
        "agents",
        {202: verification.VerifyStarted},
        body=verification.VerifyRequest,
        errors=frozenset({409}),
    ),
    Operation(
        "GET",
        "/api/v1/agents/{agent_id}/verifications",
        "Each GPU of a host with its latest verification and its history of runs",
        "agents",
        {200: verification.HostVerificationsView},
        query=schemas.EmptyQuery,
    ),
    # --- telemetry history (docs/monitoring.md)
    Operation(
        "GET",
        "/api/v1/gpus/{uuid}/telemetry",
        "One GPU's telemetry history over a window, at a step",
        "telemetry",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
    ),
    Operation(
        "GET",
        "/api/v1/agents/{agent_id}/telemetry",
        "A host's telemetry history: a series per GPU, and its own CPU, memory, disk and network",
        "telemetry",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
    ),
    Operation(
        "GET",
        "/api/v1/workloads/{workload_id}/telemetry",
        "The telemetry of the GPUs a workload ran on, per GPU and run",
        "telemetry",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
    ),
    # --- commands, join tokens, events, signing keys (operator)
    Operation(
        "POST",
        "/api/v1/commands",
        "Send a raw container command to a host",
        "commands",
        {202: r.CommandAccepted},
        body=schemas.CreateCommand,
        errors=frozenset({404, 409}),
    ),
    Operation("GET", "/api/v1/commands", "Commands, newest first", "commands", {200: r.CommandPage}, query=schemas.CommandQuery),
    Operation("GET", "/api/v1/commands/{command_id}", "One command", "commands", {200: r.CommandView}, query=schemas.EmptyQuery),
    Operation(
        "POST",
        "/api/v1/tokens",
        "A one-time join token for a provider's hosts",
        "tokens",
        {201: r.TokenView},
        body=schemas.CreateToken,
        errors=frozenset({404, 409}),
    ),
    Operation("GET", "/api/v1/events", "The event log in sequence order", "events", {200: r.EventPage}, query=schemas.EventQuery),
    Operation(
        "GET",
        "/api/v1/signing-keys",
        "Command-signing keys, newest first",
        "signing-keys",
        {200: r.SigningKeyPage},
        query=schemas.PageQuery,
    ),
    Operation("POST", "/api/v1/signing-keys/rotate", "A new command-signing key", "signing-keys", {201: r.SigningKeyView}),
    Operation(
        "POST",
        "/api/v1/signing-keys/{key_id}/retire",
        "Retire a command-signing key",
        "signing-keys",
        {200: r.SigningKeyView},
        errors=frozenset({409}),
    ),
    # --- workloads
    Operation(
        "POST",
        "/api/v1/workloads",
        "Submit a workload",
        "workloads",
        {201: r.WorkloadView},
        body=schemas.SubmitWorkload,
        errors=frozenset({402, 404, 409}),
    ),
    Operation(
        "GET", "/api/v1/workloads", "Workloads, newest first", "workloads", {200: r.WorkloadPage}, query=schemas.WorkloadQuery
    ),
    Operation(
        "GET",
        "/api/v1/workloads/{workload_id}",
        "One workload, and why it waits",
        "workloads",
        {200: r.WorkloadDetail},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "GET",
        "/api/v1/workloads/{workload_id}/explain",
        "Why a queued workload waits",
        "workloads",
        {200: r.ExplanationView},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),
    ),
    Operation(
        "POST",
        "/api/v1/workloads/{workload_id}/cancel",
        "Cancel a workload",
        "workloads",
        {200: r.WorkloadView},
        errors=frozenset({409}),
    ),
    Operation(
        "POST",
        "/api/v1/workloads/{workload_id}/tunnels",
        "Open a tunnel to a workload's container: its logs, a shell or a port (docs/access.md)",
        "workloads",
        {201: r.TunnelGrantView},
        body=TunnelRequest,
        errors=frozenset({409}),
    ),
    Operation(
        "GET",
        "/api/v1/workloads/{workload_id}/logs",
        "A workload's container output, streamed as text",
        "workloads",
        {200: None},
        query=tunnels.LogsQuery,
        media=("text/plain",),
        errors=frozenset({409}),
    ),
    Operation(
        "POST",
        "/api/v1/workloads/{workload_id}/bid",
        "Change an interruptible workload's bid",
        "market",
        {200: r.WorkloadView},
        body=market.ChangeBid,
        errors=frozenset({402, 409}),
    ),
    # --- accounts and API keys
    Operation(
        "GET", "/api/v1/whoami", "The calling key and its account", "accounts", {200: r.WhoamiView}, query=schemas.EmptyQuery
    ),
    Operation(
        "POST",
        "/api/v1/accounts",
        "Create an account",
        "accounts",
        {201: r.AccountView},
        body=schemas.CreateAccount,
        errors=frozenset({409}),
    ),
    Operation("GET", "/api/v1/accounts", "Accounts, by id", "accounts", {200: r.AccountPage}, query=schemas.AccountQuery),
    Operation("GET", "/api/v1/accounts/{account_id}", "One account", "accounts", {200: r.AccountView}, query=schemas.EmptyQuery),
    Operation(
        "PATCH",
        "/api/v1/accounts/{account_id}",
        "Change an account's fields",
        "accounts",
        {200: r.AccountView},
        body=schemas.UpdateAccount,
        errors=frozenset({409}),
    ),
    Operation(
        "PUT",
        "/api/v1/accounts/{account_id}/password",
        "Set the account's console password (the operator anyone's, an account its own with the current one)",
        "accounts",
        {200: r.AccountView},
        body=schemas.SetPassword,
    ),
    Operation(
        "POST",
        "/api/v1/accounts/{account_id}/keys",
        "A new API key, shown once",
        "accounts",
        {201: r.IssuedApiKeyView},
        body=schemas.CreateApiKey,
        errors=frozenset({409}),  # the account is disabled
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/keys",
        "An account's API keys, oldest first",
        "accounts",
        {200: r.ApiKeyPage},
        query=schemas.PageQuery,
    ),
    Operation("POST", "/api/v1/keys/{key_id}/revoke", "Revoke an API key", "accounts", {200: r.ApiKeyView}),
    # --- the market: offers, money, rentals
    Operation("GET", "/api/v1/offers", "Search offers (docs/offers.md)", "market", {200: r.OfferSearch}, query=market.OfferQuery),
    Operation("GET", "/api/v1/offers/{offer_id}", "One host's offer now", "market", {200: r.OfferView}, query=schemas.EmptyQuery),
    Operation(
        "POST",
        "/api/v1/offers/{offer_id}/rent",
        "Rent an offer: a workload pinned to that host",
        "market",
        {201: r.WorkloadView},
        body=market.RentOffer,
        errors=frozenset({402, 409}),
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/balance",
        "An account's balance",
        "market",
        {200: r.FundsView},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "POST",
        "/api/v1/accounts/{account_id}/credit",
        "Credit a renter's balance",
        "market",
        {201: r.Credited},
        body=market.Credit,
        errors=frozenset({409}),
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/ledger",
        "An account's ledger statement (JSON or CSV)",
        "market",
        {200: r.StatementView},
        query=market.LedgerQuery,
        media=(JSON, "text/csv"),
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/spend",
        "A renter's spend per workload",
        "market",
        {200: r.SpendStatements},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/earnings",
        "A provider's earnings per host",
        "market",
        {200: r.EarningsStatements},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "GET",
        "/api/v1/accounts/{account_id}/payouts",
        "A provider's earnings per period",
        "market",
        {200: r.PayoutStatements},
        query=market.PayoutQuery,
    ),
    Operation(
        "GET", "/api/v1/rentals", "Rentals, with what was charged", "market", {200: r.RentalPage}, query=market.RentalQuery
    ),
    Operation("GET", "/api/v1/rentals/{rental_id}", "One rental", "market", {200: r.RentalView}, query=schemas.EmptyQuery),
    Operation(
        "POST",
        "/api/v1/rentals/{rental_id}/rating",
        "Rate an ended rental, 1 to 5",
        "market",
        {200: r.RentalView},
        body=market.Rate,
        errors=frozenset({409}),
    ),
    # --- the market: prices
    Operation(
        "GET",
        "/api/v1/prices",
        "Providers' price records and the grid's default",
        "prices",
        {200: r.PriceListing},
        query=schemas.PriceQuery,
        errors=frozenset({404}),  # a provider naming another provider in ?provider=
    ),
    Operation(
        "PUT",
        "/api/v1/prices/default",
        "Set a provider's default price",
        "prices",
        {200: r.PriceRecordView},
        body=schemas.SetDefaultPrice,
        errors=frozenset({404}),
    ),
    Operation(
        "GET",
        "/api/v1/agents/{agent_id}/price",
        "The price in force on a host",
        "prices",
        {200: r.HostPriceView},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "PUT",
        "/api/v1/agents/{agent_id}/price",
        "Set a host's own price",
        "prices",
        {200: r.HostPriceView},
        body=schemas.SetPrice,
    ),
    Operation(
        "DELETE",
        "/api/v1/agents/{agent_id}/price",
        "Clear a host's own price",
        "prices",
        {200: r.HostPriceView},
        query=schemas.EmptyQuery,
    ),
    # --- alerts (management/api/alerts.py)
    Operation(
        "GET", "/api/v1/alert-rules", "Alert rules, by name", "alerts", {200: alerts.AlertRuleList}, query=schemas.EmptyQuery
    ),
    Operation(
        "PUT",
        "/api/v1/alert-rules/{name}",
        "Put an alert rule (replaces the rules file's rule of that name)",
        "alerts",
        {200: alerts.AlertRuleView},
        body=alerts.PutAlertRule,
    ),
    Operation(
        "DELETE",
        "/api/v1/alert-rules/{name}",
        "Delete a rule put through the API",
        "alerts",
        {200: alerts.DeletedAlertRule},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),  # a rule of the rules file
    ),
    Operation(
        "GET",
        "/api/v1/alerts",
        "Alerts pending and firing, and recent transitions",
        "alerts",
        {200: alerts.AlertList},
        query=alerts.AlertQuery,
    ),
    Operation(
        "POST",
        "/api/v1/silences",
        "Silence matching alerts' notifications",
        "alerts",
        {201: alerts.SilenceView},
        body=alerts.CreateSilence,
    ),
    Operation("GET", "/api/v1/silences", "Silences in force", "alerts", {200: alerts.SilenceList}, query=alerts.SilenceQuery),
    Operation(
        "POST",
        "/api/v1/silences/{silence_id}/expire",
        "End a silence now",
        "alerts",
        {200: alerts.SilenceView},
        query=schemas.EmptyQuery,
    ),
    Operation(
        "POST",
        "/api/v1/webhooks",
        "Add a webhook for alert notifications (its secret is shown once)",
        "alerts",
        {201: alerts.CreatedWebhook},
        body=alerts.CreateWebhook,
    ),
    Operation("GET", "/api/v1/webhooks", "Webhooks, by creation", "alerts", {200: alerts.WebhookList}, query=schemas.PageQuery),
    Operation("DELETE", "/api/v1/webhooks/{webhook_id}", "Delete a webhook", "alerts", {204: None}, query=schemas.EmptyQuery),
)
del r
OPERATIONS += (  # monitoring: reports
    Operation(
        "GET",
        "/api/v1/reports/{kind}",
        "A report along dimensions (JSON or CSV)",
        "reports",
        {200: reports_api.ReportView},
        query=reports_api.ReportQuery,
        media=(JSON, "text/csv"),
        description="kind: usage, revenue, reliability or summary; by: e.g. provider,day or tier,region.",
    ),
)


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema: an absent parameter is the null, so ``X | None`` is ``X`` (and no null default)."""
    schema = {k: v for k, v in schema.items() if not (k == "default" and v is None)}
    options = [s for s in schema.get("anyOf", ()) if s != {"type": "null"}]
    if "anyOf" in schema and len(options) == 1:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**options[0], **rest}
    if "anyOf" in schema:
        schema["anyOf"] = options
    return schema


def _query_parameters(query: type[msgspec.Struct], components: Mapping[str, Any]) -> list[dict[str, Any]]:
    struct = components[query.__name__]
    required = set(struct.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": _without_null(schema)}
        for name, schema in struct.get("properties", {}).items()
    ]


def _path_parameters(op: Operation) -> list[dict[str, Any]]:
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in op.path_parameters
    ]


def _ref(struct: type[msgspec.Struct]) -> dict[str, str]:
    return {"$ref": REF.format(name=struct.__name__)}


def _answer_content(op: Operation, struct: type[msgspec.Struct] | None) -> dict[str, Any]:
    content = {}
    for media in op.media:
        if media == JSON:
            content[media] = {"schema": _ref(struct) if struct is not None else {"type": "object"}}
        else:
            content[media] = {"schema": {"type": "string"}}
    return content


def _operation(op: Operation, components: Mapping[str, Any]) -> dict[str, Any]:
    answers: dict[str, Any] = {
        str(status): {"description": op.summary, "content": _answer_content(op, struct)} for status, struct in op.answers.items()
    }
    for status in op.error_statuses:
        answers[str(status)] = {"description": ERROR_SAID.get(status, "Refused"), "content": {JSON: {"schema": _ref(Error)}}}
        if status in RETRY_AFTER_STATUSES:
            answers[str(status)]["headers"] = {"Retry-After": RETRY_AFTER}
    doc: dict[str, Any] = {
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


def _structs(operations: tuple[Operation, ...]) -> list[type[msgspec.Struct]]:
    named: dict[str, type[msgspec.Struct]] = {"Error": Error}
    for op in operations:
        for struct in (op.body, op.query, *op.answers.values()):
            if struct is not None:
                named.setdefault(struct.__name__, struct)
    return list(named.values())


def build_document(operations: tuple[Operation, ...] = OPERATIONS, *, version: str = "1") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``."""
    _, components = msgspec.json.schema_components(_structs(operations), ref_template=REF)
    components = schemas.ecma_patterns(components)
    paths: dict[str, dict[str, Any]] = {}
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


@functools.cache
def document() -> dict[str, Any]:
    """This API's document (the table is fixed when the process starts; built once)."""
    return build_document()


@functools.cache
def _document_json() -> bytes:
    return msgspec.json.encode(document())


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=_document_json(), content_type=JSON)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(OPENAPI_PATH, openapi_json)


__all__ = ["OPERATIONS", "Operation", "add_routes", "build_document", "document"]
