"""The management HTTP API, served in the Master's process: one module per resource (see docs/api.md).

A handler parses the request into a schema (``schemas``), makes one call on the façade of operations
(``management.operations``) and renders the answer (``management.views``). Who may call what is decided
in ``auth``; errors take one JSON shape (``errors``); lists are paged by cursor (``paging``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from management.api import accounts, agents, commands, events, gpus, health, openapi, reference, signing_keys, tiers, tokens
from management.api import alerts as alerts_api
from management.api import market as market_api
from management.api import prices as prices_api
from management.api import reports as reports_api
from management.api import telemetry as telemetry_api
from management.api import tunnels as tunnels_api
from management.api import verification as verification_api
from management.api import workloads as workloads_api
from management.api.audit import audit_middleware
from management.api.auth import OPERATIONS_KEY, auth_middleware
from management.api.errors import ApiError, Handler, error_response, errors_middleware
from management.api.health import METRICS_REGISTRY_KEY
from management.api.metrics import ApiMetrics
from management.api.ratelimit import KeyRateLimits
from management.monitoring.market_series import MarketSeries
from management.operations import Operations
from master.service import Master

__all__ = ["ApiError", "ApiSettings", "Handler", "build_app", "error_response"]


@dataclass(frozen=True)
class ApiSettings:
    max_body_bytes: int = 256 * 1024
    # A client has this long to send a request's line and headers (Slowloris), enforced by common.http.HttpServer.
    header_timeout_s: float = 5.0
    idle_timeout_s: float = 15.0  # an idle kept-alive connection is closed after this
    # The longest request line (method, path and query) served. aiohttp's own default (8190 bytes) is shorter than a
    # query the API's bounds accept: an offer search's ``q`` of 2000 characters, percent-encoded UTF-8, is up to
    # 24000 bytes, and its cursor 12288 more. A longer line is refused by aiohttp itself (400, plain text).
    max_request_line_bytes: int = 48 * 1024
    # Each API key may make this many requests a second sustained, and this many at once (management/api/ratelimit.py).
    key_rate_per_s: float = 20.0
    key_burst: int = 40
    # Each account, all its keys together, this many a second sustained and this many at once.
    account_rate_per_s: float = 40.0
    account_burst: int = 80


async def _load_workloads(app: web.Application) -> None:
    """The open workloads are in memory before the first call (and for the scheduling loop), after any restart."""
    await app[OPERATIONS_KEY].workloads.load()


async def _load_prices(app: web.Application) -> None:
    """Providers' prices are in memory before the first call (the offer index and scheduler read them there)."""
    await app[OPERATIONS_KEY].prices.load()


async def _load_market(app: web.Application) -> None:
    """Balances, open rentals and the fee window's figures are in memory before the first call, after any restart."""
    await app[OPERATIONS_KEY].market.market.load()


def build_app(master: Master, settings: ApiSettings | None = None, operations: Operations | None = None) -> web.Application:
    """The API over ``master``; ``operations``: the façade to serve (the server's, which shares its workload book
    with the running scheduler), a new one when not given."""
    settings = settings or ApiSettings()
    operations = operations or Operations(master)
    registry = master.metrics.registry
    api_metrics = ApiMetrics(registry)
    # The market's series (management/monitoring/market_series.py), beside the fleet's (master/metrics.py).
    market = operations.market.market
    registry.register(
        MarketSeries(
            operations.workloads.counts, market.meter.open_rentals, market.ledger.balances, currency=operations.market.currency
        )
    )
    rate_limits = KeyRateLimits(
        settings.key_rate_per_s,
        settings.key_burst,
        account_rate=settings.account_rate_per_s,
        account_burst=settings.account_burst,
    )
    middlewares = [api_metrics.middleware(), errors_middleware, auth_middleware, rate_limits.middleware(), audit_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[OPERATIONS_KEY] = operations
    app[METRICS_REGISTRY_KEY] = registry
    for resource in (health, accounts, agents, gpus, tiers, commands, tokens, events, signing_keys):
        resource.add_routes(app.router)
    workloads_api.add_routes(app.router)
    prices_api.add_routes(app.router)
    market_api.add_routes(app.router)
    tunnels_api.add_routes(app.router)
    reports_api.add_routes(app.router)  # monitoring: reports along dimensions
    alerts_api.add_routes(app.router)
    telemetry_api.add_routes(app.router)  # monitoring: telemetry history
    verification_api.add_routes(app.router)  # measured verification
    openapi.add_routes(app.router)  # the API described (management/api/openapi.py), and its reference page
    reference.add_routes(app.router)
    app.on_startup.append(_load_workloads)
    app.on_startup.append(_load_prices)
    app.on_startup.append(_load_market)
    # The web console, from the same origin (management/console/, docs/console.md). Imported here: its pages import
    # management.api.auth (one place decides who may do what), so importing it above would make a cycle.
    from management.console import add_console

    # What a provider's host fetches to onboard (management/onboarding/): outside /api/, no key.
    from management.onboarding.routes import add_routes as add_onboarding_routes

    add_onboarding_routes(app.router)
    add_console(app, operations, operations.console_settings, state_dir=operations.state_path)
    return app
