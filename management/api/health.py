"""/healthz and /metrics: unauthenticated, for load balancers and Prometheus."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from management.http.keys import SERVICES_KEY
from management.http.requests import json_response

METRICS_REGISTRY_KEY = web.AppKey("metrics_registry", CollectorRegistry)
# Awaited before each scrape: work too long to do in one go on the event loop, done in slices (master/metrics.py).
METRICS_PREPARE_KEY: web.AppKey[Callable[[], Awaitable[None]]] = web.AppKey("metrics_prepare")


async def healthz(request: web.Request) -> web.Response:
    health = request.app[SERVICES_KEY].grid.health()
    # role/ready/leader (docs/ha.md): a standby is live (200) but not ready to serve; ``leader``: whom to ask instead.
    return json_response(
        {
            "status": "ok",
            "store": health.store,
            "relays": health.relays,
            "role": health.role,
            "ready": health.ready,
            "leader": health.leader,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    prepare = request.app.get(METRICS_PREPARE_KEY)
    if prepare is not None:
        await prepare()
    body = generate_latest(request.app[METRICS_REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/healthz", healthz)
    router.add_get("/metrics", metrics)
