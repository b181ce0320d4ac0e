"""Every route of the management API, declared once: the router (``add_routes``), the authorization
(management/api/auth.py) and the OpenAPI document (management/api/openapi.py) all read ``ROUTES``.

To add a route: write its handler in the resource's module (HTTP in, one call on the services, a typed answer struct
out) and add one ``Route`` to ``ROUTES`` below, in its tag's block. Nothing else is edited: the route is served,
authorized by its resource and action (management/access_control.py) and described in the document.
tests/management/test_api_routing.py fails when the app serves an /api/ route without a declaration.

Routes outside ``/api/`` are not part of the API and not declared here: /healthz and /metrics (health.py), the console
(management/console/) and what a provider's host fetches to onboard (management/onboarding/).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from management.access_control import Action, Resource
from management.api import openapi, reference
from management.api.openapi import DOCUMENT_KEY, PublishedDocument, build_document
from management.api.resources import (
    accounts,
    agents,
    alerts,
    commands,
    events,
    gpus,
    market,
    prices,
    reports,
    signing_keys,
    telemetry,
    tiers,
    tokens,
    tunnels,
    workloads,
)
from management.api.route import DECLARED_KEY, JSON, DeclarationError, Route
from management.http import responses, schemas
from management.services.tunnels import TunnelRequest

r = responses
# Route(method, path, handler, resource, action, summary, {status: answer struct}, tag=..., body=..., query=...,
# errors=frozenset({409, ...})); resource and action None: public, served without a key.
ROUTES: tuple[Route, ...] = (
    # --- docs
    Route("GET", openapi.OPENAPI_PATH, openapi.openapi_json, None, None, "This OpenAPI 3.1 document", {200: None}, tag="docs"),
    Route(
        "GET",
        reference.DOCS_PATH,
        reference.reference_page,
        None,
        None,
        "The API reference page (HTML, from this document)",
        {200: None},
        media=("text/html",),
        tag="docs",
    ),
    # --- agents
    Route(
        "GET",
        "/api/v1/agents",
        agents.list_agents,
        Resource.AGENTS,
        Action.READ,
        "Hosts, by id",
        {200: r.AgentPage},
        query=schemas.AgentQuery,
        tag="agents",
    ),
    Route(
        "GET",
        "/api/v1/agents/{agent_id}",
        agents.get_agent,
        Resource.AGENTS,
        Action.READ,
        "One host with its GPUs, reputation and workloads",
        {200: r.AgentView},
        query=schemas.EmptyQuery,
        tag="agents",
    ),
    Route(
        "POST",
        "/api/v1/agents/{agent_id}/drain",
        agents.drain_agent,
        Resource.AGENTS,
        Action.MAINTAIN,
        "Take a host into maintenance: no new work",
        {200: r.AgentView},
        errors=frozenset({409}),
        tag="agents",
    ),
    Route(
        "POST",
        "/api/v1/agents/{agent_id}/undrain",
        agents.undrain_agent,
        Resource.AGENTS,
        Action.MAINTAIN,
        "Bring a drained host back to work",
        {200: r.AgentView},
        errors=frozenset({409}),
        tag="agents",
    ),
    Route(
        "POST",
        "/api/v1/agents/{agent_id}/revoke",
        agents.revoke_agent,
        Resource.AGENTS,
        Action.WRITE,
        "Revoke a host's certificates on every relay",
        {200: r.AgentView},
        errors=frozenset({409}),
        tag="agents",
    ),
    # --- gpus
    Route(
        "GET",
        "/api/v1/gpus",
        gpus.list_gpus,
        Resource.GPUS,
        Action.READ,
        "GPUs, by host and index",
        {200: r.GpuPage},
        query=schemas.GpuQuery,
        tag="gpus",
    ),
    Route(
        "POST",
        "/api/v1/gpus/{uuid}/repair",
        gpus.repair_gpu,
        Resource.GPUS,
        Action.WRITE,  # clearing a fault: the operator's call
        "Put a faulty GPU back in service",
        {200: r.GpuView},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),
        tag="gpus",
    ),
    # --- tiers
    Route(
        "GET",
        "/api/v1/tiers",
        tiers.list_tiers,
        Resource.TIERS,
        Action.READ,
        "The tiers GPUs are sold in, best first",
        {200: r.TierPage},
        query=schemas.PageQuery,
        tag="tiers",
    ),
    # --- telemetry
    Route(
        "GET",
        "/api/v1/gpus/{uuid}/telemetry",
        telemetry.gpu_telemetry,
        Resource.GPUS,
        Action.READ,
        "One GPU's telemetry history over a window, at a step",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
        tag="telemetry",
    ),
    Route(
        "GET",
        "/api/v1/agents/{agent_id}/telemetry",
        telemetry.host_telemetry,
        Resource.AGENTS,
        Action.READ,
        "A host's telemetry history: a series per GPU, and its own CPU, memory, disk and network",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
        tag="telemetry",
    ),
    Route(
        "GET",
        "/api/v1/workloads/{workload_id}/telemetry",
        telemetry.workload_telemetry,
        Resource.WORKLOADS,
        Action.READ,
        "The telemetry of the GPUs a workload ran on, per GPU and run",
        {200: r.TelemetryView},
        query=schemas.TelemetryQuery,
        tag="telemetry",
    ),
    # --- commands
    Route(
        "POST",
        "/api/v1/commands",
        commands.create_command,
        Resource.COMMANDS,
        Action.WRITE,
        "Send a raw container command to a host",
        {202: r.CommandAccepted},
        body=schemas.CreateCommand,
        errors=frozenset({404, 409}),
        tag="commands",
    ),
    Route(
        "GET",
        "/api/v1/commands",
        commands.list_commands,
        Resource.COMMANDS,
        Action.READ,
        "Commands, newest first",
        {200: r.CommandPage},
        query=schemas.CommandQuery,
        tag="commands",
    ),
    Route(
        "GET",
        "/api/v1/commands/{command_id}",
        commands.get_command,
        Resource.COMMANDS,
        Action.READ,
        "One command",
        {200: r.CommandView},
        query=schemas.EmptyQuery,
        tag="commands",
    ),
    # --- tokens
    Route(
        "POST",
        "/api/v1/tokens",
        tokens.create_token,
        Resource.TOKENS,
        Action.WRITE,
        "A one-time join token for a provider's hosts",
        {201: r.TokenView},
        body=schemas.CreateToken,
        errors=frozenset({404, 409}),
        tag="tokens",
    ),
    # --- events
    Route(
        "GET",
        "/api/v1/events",
        events.list_events,
        Resource.EVENTS,
        Action.READ,
        "The event log in sequence order",
        {200: r.EventPage},
        query=schemas.EventQuery,
        tag="events",
    ),
    # --- signing-keys
    Route(
        "GET",
        "/api/v1/signing-keys",
        signing_keys.list_signing_keys,
        Resource.SIGNING_KEYS,
        Action.READ,
        "Command-signing keys, newest first",
        {200: r.SigningKeyPage},
        query=schemas.PageQuery,
        tag="signing-keys",
    ),
    Route(
        "POST",
        "/api/v1/signing-keys/rotate",
        signing_keys.rotate_signing_key,
        Resource.SIGNING_KEYS,
        Action.WRITE,
        "A new command-signing key",
        {201: r.SigningKeyView},
        tag="signing-keys",
    ),
    Route(
        "POST",
        "/api/v1/signing-keys/{key_id}/retire",
        signing_keys.retire_signing_key,
        Resource.SIGNING_KEYS,
        Action.WRITE,
        "Retire a command-signing key",
        {200: r.SigningKeyView},
        errors=frozenset({409}),
        tag="signing-keys",
    ),
    # --- workloads
    Route(
        "POST",
        "/api/v1/workloads",
        workloads.submit_workload,
        Resource.WORKLOADS,
        Action.WRITE,
        "Submit a workload",
        {201: r.WorkloadView},
        body=schemas.SubmitWorkload,
        errors=frozenset({402, 404, 409}),
        tag="workloads",
    ),
    Route(
        "GET",
        "/api/v1/workloads",
        workloads.list_workloads,
        Resource.WORKLOADS,
        Action.READ,
        "Workloads, newest first",
        {200: r.WorkloadPage},
        query=schemas.WorkloadQuery,
        tag="workloads",
    ),
    Route(
        "GET",
        "/api/v1/workloads/{workload_id}",
        workloads.get_workload,
        Resource.WORKLOADS,
        Action.READ,
        "One workload, and why it waits",
        {200: r.WorkloadDetail},
        query=schemas.EmptyQuery,
        tag="workloads",
    ),
    Route(
        "GET",
        "/api/v1/workloads/{workload_id}/explain",
        workloads.explain_workload,
        Resource.WORKLOADS,
        Action.READ,
        "Why a queued workload waits",
        {200: r.ExplanationView},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),
        tag="workloads",
    ),
    Route(
        "POST",
        "/api/v1/workloads/{workload_id}/cancel",
        workloads.cancel_workload,
        Resource.WORKLOADS,
        Action.WRITE,
        "Cancel a workload",
        {200: r.WorkloadView},
        errors=frozenset({409}),
        tag="workloads",
    ),
    Route(
        "POST",
        "/api/v1/workloads/{workload_id}/tunnels",
        tunnels.open_tunnel,
        Resource.WORKLOADS,
        Action.WRITE,
        "Open a tunnel to a workload's container: its logs, a shell or a port (docs/access.md)",
        {201: r.TunnelGrantView},
        body=TunnelRequest,
        errors=frozenset({409}),
        tag="workloads",
    ),
    Route(
        "GET",
        "/api/v1/workloads/{workload_id}/logs",
        tunnels.workload_logs,
        Resource.WORKLOADS,
        Action.READ,
        "A workload's container output, streamed as text",
        {200: None},
        query=tunnels.LogsQuery,
        errors=frozenset({409}),
        media=("text/plain",),
        tag="workloads",
    ),
    # --- market
    Route(
        "POST",
        "/api/v1/workloads/{workload_id}/bid",
        market.change_bid,
        Resource.WORKLOADS,
        Action.WRITE,
        "Change an interruptible workload's bid",
        {200: r.WorkloadView},
        body=market.ChangeBid,
        errors=frozenset({402, 409}),
        tag="market",
    ),
    # --- accounts
    Route(
        "GET",
        "/api/v1/whoami",
        accounts.whoami,
        Resource.ACCOUNTS,
        Action.READ,
        "The calling key and its account",
        {200: r.WhoamiView},
        query=schemas.EmptyQuery,
        tag="accounts",
    ),
    Route(
        "POST",
        "/api/v1/accounts",
        accounts.create_account,
        Resource.ACCOUNTS,
        Action.WRITE,
        "Create an account",
        {201: r.AccountView},
        body=schemas.CreateAccount,
        errors=frozenset({409}),
        tag="accounts",
    ),
    Route(
        "GET",
        "/api/v1/accounts",
        accounts.list_accounts,
        Resource.ACCOUNTS,
        Action.READ,
        "Accounts, by id",
        {200: r.AccountPage},
        query=schemas.AccountQuery,
        tag="accounts",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}",
        accounts.get_account,
        Resource.ACCOUNTS,
        Action.READ,
        "One account",
        {200: r.AccountView},
        query=schemas.EmptyQuery,
        tag="accounts",
    ),
    Route(
        "PATCH",
        "/api/v1/accounts/{account_id}",
        accounts.update_account,
        Resource.ACCOUNTS,
        Action.WRITE,
        "Change an account's fields",
        {200: r.AccountView},
        body=schemas.UpdateAccount,
        errors=frozenset({409}),
        tag="accounts",
    ),
    Route(
        "PUT",
        "/api/v1/accounts/{account_id}/password",
        accounts.set_password,
        Resource.PASSWORD,
        Action.WRITE,
        "Set the account's console password (the operator anyone's, an account its own with the current one)",
        {200: r.AccountView},
        body=schemas.SetPassword,
        tag="accounts",
    ),
    Route(
        "POST",
        "/api/v1/accounts/{account_id}/keys",
        accounts.create_api_key,
        Resource.KEYS,
        Action.WRITE,
        "A new API key, shown once",
        {201: r.IssuedApiKeyView},
        body=schemas.CreateApiKey,
        errors=frozenset({409}),  # the account is disabled
        tag="accounts",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/keys",
        accounts.list_api_keys,
        Resource.KEYS,
        Action.READ,
        "An account's API keys, oldest first",
        {200: r.ApiKeyPage},
        query=schemas.PageQuery,
        tag="accounts",
    ),
    Route(
        "POST",
        "/api/v1/keys/{key_id}/revoke",
        accounts.revoke_api_key,
        Resource.KEYS,
        Action.WRITE,
        "Revoke an API key",
        {200: r.ApiKeyView},
        tag="accounts",
    ),
    # --- market
    Route(
        "GET",
        "/api/v1/offers",
        market.search_offers,
        Resource.OFFERS,
        Action.READ,
        "Search offers (docs/offers.md)",
        {200: r.OfferSearch},
        query=market.OfferQuery,
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/offers/{offer_id}",
        market.get_offer,
        Resource.OFFERS,
        Action.READ,
        "One host's offer now",
        {200: r.OfferView},
        query=schemas.EmptyQuery,
        tag="market",
    ),
    Route(
        "POST",
        "/api/v1/offers/{offer_id}/rent",
        market.rent_offer,
        Resource.WORKLOADS,  # renting makes a workload
        Action.WRITE,
        "Rent an offer: a workload pinned to that host",
        {201: r.WorkloadView},
        body=market.RentOffer,
        errors=frozenset({402, 409}),
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/balance",
        market.get_balance,
        Resource.LEDGER,
        Action.READ,
        "An account's balance",
        {200: r.FundsView},
        query=schemas.EmptyQuery,
        tag="market",
    ),
    Route(
        "POST",
        "/api/v1/accounts/{account_id}/credit",
        market.credit_account,
        Resource.LEDGER,
        Action.WRITE,
        "Credit a renter's balance",
        {201: r.Credited},
        body=market.Credit,
        errors=frozenset({409}),
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/ledger",
        market.get_ledger,
        Resource.LEDGER,
        Action.READ,
        "An account's ledger statement (JSON or CSV)",
        {200: r.StatementView},
        query=market.LedgerQuery,
        media=(JSON, "text/csv"),
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/spend",
        market.get_spend,
        Resource.LEDGER,
        Action.READ,
        "A renter's spend per workload",
        {200: r.SpendStatements},
        query=schemas.EmptyQuery,
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/earnings",
        market.get_earnings,
        Resource.LEDGER,
        Action.READ,
        "A provider's earnings per host",
        {200: r.EarningsStatements},
        query=schemas.EmptyQuery,
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/accounts/{account_id}/payouts",
        market.get_payouts,
        Resource.LEDGER,
        Action.READ,
        "A provider's earnings per period",
        {200: r.PayoutStatements},
        query=market.PayoutQuery,
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/rentals",
        market.list_rentals,
        Resource.RENTALS,
        Action.READ,
        "Rentals, with what was charged",
        {200: r.RentalPage},
        query=market.RentalQuery,
        tag="market",
    ),
    Route(
        "GET",
        "/api/v1/rentals/{rental_id}",
        market.get_rental,
        Resource.RENTALS,
        Action.READ,
        "One rental",
        {200: r.RentalView},
        query=schemas.EmptyQuery,
        tag="market",
    ),
    Route(
        "POST",
        "/api/v1/rentals/{rental_id}/rating",
        market.rate_rental,
        Resource.RENTALS,
        Action.WRITE,
        "Rate an ended rental, 1 to 5",
        {200: r.RentalView},
        body=market.Rate,
        errors=frozenset({409}),
        tag="market",
    ),
    # --- prices
    Route(
        "GET",
        "/api/v1/prices",
        prices.list_prices,
        Resource.PRICES,
        Action.READ,
        "Providers' price records and the grid's default",
        {200: r.PriceListing},
        query=schemas.PriceQuery,
        errors=frozenset({404}),  # a provider naming another provider in ?provider=
        tag="prices",
    ),
    Route(
        "PUT",
        "/api/v1/prices/default",
        prices.set_default_price,
        Resource.PRICES,
        Action.WRITE,
        "Set a provider's default price",
        {200: r.PriceRecordView},
        body=schemas.SetDefaultPrice,
        errors=frozenset({404}),
        tag="prices",
    ),
    Route(
        "GET",
        "/api/v1/agents/{agent_id}/price",
        prices.get_host_price,
        Resource.HOST_PRICES,
        Action.READ,
        "The price in force on a host",
        {200: r.HostPriceView},
        query=schemas.EmptyQuery,
        tag="prices",
    ),
    Route(
        "PUT",
        "/api/v1/agents/{agent_id}/price",
        prices.set_host_price,
        Resource.PRICES,
        Action.WRITE,
        "Set a host's own price",
        {200: r.HostPriceView},
        body=schemas.SetPrice,
        tag="prices",
    ),
    Route(
        "DELETE",
        "/api/v1/agents/{agent_id}/price",
        prices.clear_host_price,
        Resource.PRICES,
        Action.WRITE,
        "Clear a host's own price",
        {200: r.HostPriceView},
        query=schemas.EmptyQuery,
        tag="prices",
    ),
    # --- alerts
    Route(
        "GET",
        "/api/v1/alert-rules",
        alerts.list_rules,
        Resource.ALERT_RULES,
        Action.READ,
        "Alert rules, by name",
        {200: alerts.AlertRuleList},
        query=schemas.EmptyQuery,
        tag="alerts",
    ),
    Route(
        "PUT",
        "/api/v1/alert-rules/{name}",
        alerts.put_rule,
        Resource.ALERT_RULES,
        Action.WRITE,
        "Put an alert rule (replaces the rules file's rule of that name)",
        {200: alerts.AlertRuleView},
        body=alerts.PutAlertRule,
        tag="alerts",
    ),
    Route(
        "DELETE",
        "/api/v1/alert-rules/{name}",
        alerts.delete_rule,
        Resource.ALERT_RULES,
        Action.WRITE,
        "Delete a rule put through the API",
        {200: alerts.DeletedAlertRule},
        query=schemas.EmptyQuery,
        errors=frozenset({409}),  # a rule of the rules file
        tag="alerts",
    ),
    Route(
        "GET",
        "/api/v1/alerts",
        alerts.list_alerts,
        Resource.ALERTS,
        Action.READ,
        "Alerts pending and firing, and recent transitions",
        {200: alerts.AlertList},
        query=alerts.AlertQuery,
        tag="alerts",
    ),
    Route(
        "POST",
        "/api/v1/silences",
        alerts.create_silence,
        Resource.SILENCES,
        Action.WRITE,
        "Silence matching alerts' notifications",
        {201: alerts.SilenceView},
        body=alerts.CreateSilence,
        tag="alerts",
    ),
    Route(
        "GET",
        "/api/v1/silences",
        alerts.list_silences,
        Resource.SILENCES,
        Action.READ,
        "Silences in force",
        {200: alerts.SilenceList},
        query=alerts.SilenceQuery,
        tag="alerts",
    ),
    Route(
        "POST",
        "/api/v1/silences/{silence_id}/expire",
        alerts.expire_silence,
        Resource.SILENCES,
        Action.WRITE,
        "End a silence now",
        {200: alerts.SilenceView},
        query=schemas.EmptyQuery,
        tag="alerts",
    ),
    Route(
        "POST",
        "/api/v1/webhooks",
        alerts.create_webhook,
        Resource.WEBHOOKS,
        Action.WRITE,
        "Add a webhook for alert notifications (its secret is shown once)",
        {201: alerts.CreatedWebhook},
        body=alerts.CreateWebhook,
        tag="alerts",
    ),
    Route(
        "GET",
        "/api/v1/webhooks",
        alerts.list_webhooks,
        Resource.WEBHOOKS,
        Action.READ,
        "Webhooks, by creation",
        {200: alerts.WebhookList},
        query=schemas.PageQuery,
        tag="alerts",
    ),
    Route(
        "DELETE",
        "/api/v1/webhooks/{webhook_id}",
        alerts.delete_webhook,
        Resource.WEBHOOKS,
        Action.WRITE,
        "Delete a webhook",
        {204: None},
        query=schemas.EmptyQuery,
        tag="alerts",
    ),
    # --- reports
    Route(
        "GET",
        "/api/v1/reports/{kind}",
        reports.get_report,
        Resource.REPORTS,
        Action.READ,
        "A report along dimensions (JSON or CSV)",
        {200: reports.ReportView},
        query=reports.ReportQuery,
        media=(JSON, "text/csv"),
        description="kind: usage, revenue, reliability or summary; by: e.g. provider,day or tier,region.",
        tag="reports",
    ),
)
del r


def declared(routes: tuple[Route, ...] = ROUTES) -> dict[tuple[str, str], Route]:
    """(method, path) -> its declaration; a route declared twice is a DeclarationError (at import, for ``ROUTES``)."""
    table: dict[tuple[str, str], Route] = {}
    for route in routes:
        if route.key in table:
            raise DeclarationError(f"{route.method} {route.path} is declared twice")
        table[route.key] = route
    return table


DECLARED: Mapping[tuple[str, str], Route] = declared()


@functools.cache
def published() -> PublishedDocument:
    """The API's OpenAPI document (the declarations are fixed when the process starts: built once)."""
    return PublishedDocument(build_document(ROUTES))


def document() -> dict[str, Any]:
    return published().document


def add_routes(app: web.Application, routes: tuple[Route, ...] | None = None) -> None:
    """Serve the declared routes (``routes``: ``ROUTES`` when not given) on ``app``, with the table the authorization
    reads and the document built from the same declarations."""
    table = DECLARED if routes is None else declared(routes)
    for route in table.values():
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)  # and its HEAD twin, which auth treats as the GET
        else:
            app.router.add_route(route.method, route.path, route.handler)
    app[DECLARED_KEY] = table
    app[DOCUMENT_KEY] = published() if routes is None else PublishedDocument(build_document(routes))


def undeclared(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of each route ``app`` serves under /api/ that no declaration names (HEAD twins of GET left out):
    empty for the API as built; tests/management/test_api_routing.py holds it to that."""
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/api/") and route.method != "HEAD"
    }
    table: Mapping[tuple[str, str], Route] = app[DECLARED_KEY]
    return served - set(table)


__all__ = ["DECLARED", "JSON", "ROUTES", "Route", "add_routes", "declared", "document", "published", "undeclared"]
