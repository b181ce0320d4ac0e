"""The operator HTTP API, served in the Master's process. Handlers only translate HTTP to Master calls."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from common.errors import IdlegridError, NotFound
from management.views import agent_view, command_view, event_view, gpu_view, signing_key_view
from master.records import ApiKeyRecord
from master.service import Master
from master.states import AgentState, CommandState
from master.tiers import describe_tiers

log = logging.getLogger(__name__)

MASTER_KEY = web.AppKey("master", Master)
PRINCIPAL_KEY = web.RequestKey("principal", ApiKeyRecord)
MAX_BODY = 256 * 1024

_STATUS = {
    "not_found": 404,
    "conflict": 409,
    "invalid_transition": 409,
    "invalid_command": 400,
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
}


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


class ApiError(IdlegridError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = status


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, str(exc))
    except IdlegridError as exc:
        return error_response(_STATUS.get(exc.code, 400), exc.code, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or exc.reason)
    except Exception:
        log.exception("API handler failed", extra={"path": request.path})
        return error_response(500, "internal", "internal error; see the Master's log")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/api/"):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise ApiError(401, "unauthorized", "send an API key as 'Authorization: Bearer <key>'")
    try:
        principal = await request.app[MASTER_KEY].check_api_key(key.strip())
    except NotFound:
        raise ApiError(401, "unauthorized", "API key not recognised") from None
    if principal.role != "operator":
        raise ApiError(403, "forbidden", f"role {principal.role!r} may not use the operator API")
    request[PRINCIPAL_KEY] = principal
    return await handler(request)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "bad_json", "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "request body must be a JSON object")
    return body


def _items(items: list[dict[str, Any]]) -> web.Response:
    return web.json_response({"items": items})


# --- handlers --------------------------------------------------------------------------------


async def list_agents(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    state = request.query.get("state")
    agents = sorted(master.registry.agents.values(), key=lambda a: a.id)
    latest = master.telemetry.latest
    return _items([agent_view(a, master.registry.gpus_of(a.id), latest) for a in agents if state in (None, a.state)])


async def get_agent(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    agent = master.registry.get(request.match_info["agent_id"])
    return web.json_response(agent_view(agent, master.registry.gpus_of(agent.id), master.telemetry.latest))


async def list_gpus(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    q = request.query
    wanted = {k: q[k] for k in ("tier", "state", "model", "agent_id") if k in q}
    gpus = sorted(master.registry.gpus.values(), key=lambda g: (g.agent_id, g.index))
    latest = master.telemetry.latest
    return _items([gpu_view(g, latest.get(g.uuid)) for g in gpus if all(getattr(g, k) == v for k, v in wanted.items())])


async def list_tiers(request: web.Request) -> web.Response:
    return _items(describe_tiers(request.app[MASTER_KEY].policy))


async def create_command(request: web.Request) -> web.Response:
    body = await _json_body(request)
    missing = [k for k in ("agent_id", "kind", "spec") if k not in body]
    if missing:
        raise ApiError(400, "bad_request", f"missing field(s): {', '.join(missing)}")
    if not isinstance(body["spec"], dict):
        raise ApiError(400, "bad_request", "spec must be a JSON object")
    timeout = body.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ApiError(400, "bad_request", "timeout_s must be a positive number")
    record = await request.app[MASTER_KEY].ledger.create(
        str(body["agent_id"]), str(body["kind"]), body["spec"], timeout_s=timeout
    )
    return web.json_response({"id": record.id, "state": record.state}, status=202)


async def get_command(request: web.Request) -> web.Response:
    record = await request.app[MASTER_KEY].ledger.get(request.match_info["command_id"])
    return web.json_response(command_view(record))


async def list_commands(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    states = request.query.getall("state", None)
    records = await master.store.commands.list(agent_id=request.query.get("agent_id"), states=states, limit=_limit(request))
    return _items([command_view(r) for r in records])


async def drain_agent(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    agent = await master.drain(request.match_info["agent_id"])
    return web.json_response(agent_view(agent, master.registry.gpus_of(agent.id)))


async def revoke_agent(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    agent = await master.revoke(request.match_info["agent_id"])
    return web.json_response(agent_view(agent, master.registry.gpus_of(agent.id)))


async def list_signing_keys(request: web.Request) -> web.Response:
    return _items([signing_key_view(k) for k in request.app[MASTER_KEY].authority.keys.describe()])


async def rotate_signing_key(request: web.Request) -> web.Response:
    info = await request.app[MASTER_KEY].rotate_signing_key()
    return web.json_response(signing_key_view(info), status=201)


async def retire_signing_key(request: web.Request) -> web.Response:
    info = await request.app[MASTER_KEY].retire_signing_key(request.match_info["key_id"])
    return web.json_response(signing_key_view(info))


async def create_token(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    body = await _json_body(request)
    provider = body.get("provider")
    if not isinstance(provider, str) or not provider:
        raise ApiError(400, "bad_request", "provider (the account the token enrolls hosts for) is required")
    ttl = body.get("ttl_s", master.config.token_ttl_s)
    if not isinstance(ttl, (int, float)) or not 0 < ttl <= 30 * 86400:
        raise ApiError(400, "bad_request", "ttl_s must be a number of seconds between 1 and 2592000")
    token, record = await master.enrollment.create_token(provider, float(ttl))
    return web.json_response({"token": token, "provider": provider, "expires_at": record.expires_at}, status=201)


async def list_events(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        raise ApiError(400, "bad_request", "after must be an integer event sequence number") from None
    events = await master.store.events.list(
        subject=request.query.get("subject"), kind_prefix=request.query.get("kind"), after_seq=after, limit=_limit(request)
    )
    return _items([event_view(e) for e in events])


def _limit(request: web.Request) -> int:
    try:
        return max(1, min(1000, int(request.query.get("limit", "100"))))
    except ValueError:
        raise ApiError(400, "bad_request", "limit must be an integer") from None


async def healthz(request: web.Request) -> web.Response:
    master = request.app[MASTER_KEY]
    return web.json_response({"status": "ok", "store": master.store.backend, "relays": sorted(master.hub.links)})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[METRICS_KEY].collect()), headers={"Content-Type": CONTENT_TYPE_LATEST})


# --- metrics ---------------------------------------------------------------------------------


class MasterMetrics:
    """Gauges read from the Master's memory at scrape time, in a registry of their own."""

    def __init__(self, master: Master) -> None:
        self.master = master
        self.registry = CollectorRegistry()
        self.agents = Gauge("idlegrid_agents", "Agents by state", ["state"], registry=self.registry)
        self.gpus = Gauge("idlegrid_gpus", "GPUs by state and tier", ["state", "tier"], registry=self.registry)
        self.commands = Gauge("idlegrid_commands_open", "Commands not yet final", ["state"], registry=self.registry)
        self.relays = Gauge("idlegrid_relays_connected", "Access relays linked to this Master", registry=self.registry)

    def collect(self) -> CollectorRegistry:
        registry = self.master.registry
        for state in AgentState:
            self.agents.labels(state.value).set(sum(1 for a in registry.agents.values() if a.state == state.value))
        counts: dict[tuple[str, str], int] = {}
        for gpu in registry.gpus.values():
            key = (gpu.state, gpu.tier or "none")
            counts[key] = counts.get(key, 0) + 1
        self.gpus.clear()
        for (state, tier), n in counts.items():
            self.gpus.labels(state, tier).set(n)
        for state in (CommandState.PENDING, CommandState.SENT, CommandState.ACKED):
            self.commands.labels(state.value).set(sum(1 for c in self.master.ledger.open.values() if c.state == state.value))
        self.relays.set(len(self.master.hub.links))
        return self.registry


METRICS_KEY = web.AppKey("metrics", MasterMetrics)


def build_app(master: Master) -> web.Application:
    app = web.Application(middlewares=[errors_middleware, auth_middleware], client_max_size=MAX_BODY)
    app[MASTER_KEY] = master
    app[METRICS_KEY] = MasterMetrics(master)
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics)
    r.add_get("/api/v1/agents", list_agents)
    r.add_get("/api/v1/agents/{agent_id}", get_agent)
    r.add_post("/api/v1/agents/{agent_id}/drain", drain_agent)
    r.add_post("/api/v1/agents/{agent_id}/revoke", revoke_agent)
    r.add_get("/api/v1/gpus", list_gpus)
    r.add_get("/api/v1/tiers", list_tiers)
    r.add_post("/api/v1/commands", create_command)
    r.add_get("/api/v1/commands", list_commands)
    r.add_get("/api/v1/commands/{command_id}", get_command)
    r.add_post("/api/v1/tokens", create_token)
    r.add_get("/api/v1/signing-keys", list_signing_keys)
    r.add_post("/api/v1/signing-keys/rotate", rotate_signing_key)
    r.add_post("/api/v1/signing-keys/{key_id}/retire", retire_signing_key)
    r.add_get("/api/v1/events", list_events)
    return app
