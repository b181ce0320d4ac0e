"""The management HTTP API, served in the Master's process: one module per resource (see docs/api.md).

Each route is declared once in ``routing`` (method, path, handler, resource and action, body, query, answer), read by
the router, the authorization (``auth``) and the OpenAPI document (``openapi``). A handler parses the request into a
schema (management/http/schemas.py), makes one call on a service (``management.services``) and
answers a typed struct. Errors take one JSON shape and lists are paged by cursor (management/http/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from management.api import health, routing
from management.api.audit import audit_middleware
from management.api.auth import auth_middleware
from management.api.health import METRICS_PREPARE_KEY, METRICS_REGISTRY_KEY
from management.api.invocation import invocation_path
from management.api.metrics import ApiMetrics
from management.api.ratelimit import KeyRateLimits
from management.console import add_console
from management.http.errors import ApiError, Handler, error_response, errors_middleware
from management.http.keys import SERVICES_KEY
from management.links import proxy as link_proxy
from management.onboarding.routes import add_routes as add_onboarding_routes
from management.services import Services
from master.port import ConsoleSettings, MasterPort

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
    # Each endpoint, all its invocation keys together, this many request-route calls a second and this many at once.
    endpoint_rate_per_s: float = 2000.0
    endpoint_burst: int = 4000


def build_app(
    master: MasterPort, services: Services, settings: ApiSettings | None = None, *, console: ConsoleSettings, state_dir: Path
) -> web.Application:
    """The API over ``services`` (built, and their state loaded, by the composition root: management/app.py)."""
    settings = settings or ApiSettings()
    registry = master.metrics.registry
    api_metrics = ApiMetrics(registry)
    rate_limits = KeyRateLimits(
        settings.key_rate_per_s,
        settings.key_burst,
        account_rate=settings.account_rate_per_s,
        account_burst=settings.account_burst,
        endpoint_rate=settings.endpoint_rate_per_s,
        endpoint_burst=settings.endpoint_burst,
    )
    # Links are never served here (docs/links.md): a link's path is redirected to its own origin before anything else.
    # An endpoint's request routes called with an invocation key go no further than ``invocation_path``, which does
    # for them what the rest of the chain does (management/api/invocation.py).
    middlewares = [
        link_proxy.not_on_the_console,
        invocation_path(api_metrics, rate_limits),
        api_metrics.middleware(),
        errors_middleware,
        auth_middleware,
        rate_limits.middleware(),
        audit_middleware,
    ]
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SERVICES_KEY] = services
    app[METRICS_REGISTRY_KEY] = registry
    app[METRICS_PREPARE_KEY] = master.metrics.fleet.prepare
    health.add_routes(app.router)  # /healthz and /metrics, outside the API
    routing.add_routes(app)  # every /api/ route, as declared once in management/api/routing.py
    add_onboarding_routes(app.router)  # what a provider's host fetches to onboard (management/onboarding/): no key
    # The web console, from the same origin (management/console/, docs/console.md).
    add_console(app, services, console, state_dir=state_dir)
    return app
