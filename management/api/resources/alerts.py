"""Alerts (management/monitoring/): rules (list; put and delete: the operator's), alerts (pending and firing now,
and recent transitions; each account sees its own), silences (the operator's) and webhooks (each account its own;
the secret is shown once, in the answer that creates it). Request schemas live here, next to the handlers; the answers
are management/views/alerts.py's; both feed the OpenAPI document (openapi.py)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery, PageQuery
from management.monitoring.settings import RuleListing
from management.services.alerts import WebhookKey
from management.views.alerts import (
    alert_list_view,
    created_webhook_view,
    deleted_rule_view,
    rule_list_view,
    rule_view,
    silence_list_view,
    silence_view,
    webhook_view,
)
from master.port import RuleSpec

RuleName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9_]+\Z")]
MetricName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z_]+(\.[a-z_]+)*\Z")]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=30 * 86400.0)]
Subject = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z")]
LabelName = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[a-z_]+\Z")]
LabelValue = Annotated[str, msgspec.Meta(max_length=128)]
Comment = Annotated[str, msgspec.Meta(max_length=512)]
Url = Annotated[str, msgspec.Meta(min_length=8, max_length=2048, pattern=r"^https?://[^\s]+\Z")]
Op = Literal[">", ">=", "<", "<=", "==", "!="]
Severity = Literal["info", "warning", "critical"]
ScopeName = Literal["fleet", "tier", "region", "provider", "host", "gpu", "workload", "relay"]


# --- requests ----------------------------------------------------------------------------------------------------


class PutAlertRule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rule (the path names it): ``value op threshold`` held ``for_s`` fires; a firing alert clears once
    ``value op clear_threshold`` no longer holds for ``clear_for_s`` (hysteresis)."""

    metric: MetricName
    op: Op
    threshold: float
    for_s: Seconds = 0.0
    clear_threshold: float | None = None
    clear_for_s: Seconds = 0.0
    severity: Severity = "warning"
    scope: ScopeName = "gpu"
    fault: bool = False
    summary: Comment = ""


class AlertQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rule: RuleName | None = None
    phase: Literal["pending", "firing"] | None = None
    severity: Severity | None = None


class CreateSilence(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Hold back notifications of the alerts every given matcher matches, for ``duration_s``."""

    duration_s: Annotated[float, msgspec.Meta(gt=0, le=90 * 86400.0)]
    rule: RuleName | None = None
    subject: Subject | None = None
    labels: Annotated[dict[LabelName, LabelValue], msgspec.Meta(max_length=16)] = {}
    comment: Comment = ""


class SilenceQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    include_expired: bool = False


class CreateWebhook(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: Url


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (PutAlertRule, AlertQuery, CreateSilence, SilenceQuery, CreateWebhook)

WEBHOOKS = "webhooks"


# --- handlers ----------------------------------------------------------------------------------------------------


async def list_rules(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    listings = await request.app[SERVICES_KEY].alerts.alert_rules()
    return json_response(rule_list_view(listings))


async def put_rule(request: web.Request) -> web.Response:
    body = await parse_body(request, PutAlertRule)
    spec: RuleSpec = msgspec.to_builtins(body)
    by = scope_of(request).principal.account
    rule = await request.app[SERVICES_KEY].alerts.put_alert_rule(request.match_info["name"], spec, by=by)
    return json_response(rule_view(RuleListing(rule, "api")))


async def delete_rule(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    name = request.match_info["name"]
    shipped = await request.app[SERVICES_KEY].alerts.delete_alert_rule(name)
    return json_response(deleted_rule_view(name, shipped))


async def list_alerts(request: web.Request) -> web.Response:
    query = parse_query(request, AlertQuery)
    scope = scope_of(request)
    listing = await request.app[SERVICES_KEY].alerts.list_alerts(
        owner=scope.owner, role=scope.principal.role.value, rule=query.rule, phase=query.phase, severity=query.severity
    )
    return json_response(alert_list_view(listing))


async def create_silence(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateSilence)
    silence = await request.app[SERVICES_KEY].alerts.create_silence(
        by=scope_of(request).principal.account,
        duration_s=body.duration_s,
        rule=body.rule,
        subject=body.subject,
        labels=body.labels,
        comment=body.comment,
    )
    return json_response(silence_view(silence), status=201)


async def list_silences(request: web.Request) -> web.Response:
    query = parse_query(request, SilenceQuery)
    silences = await request.app[SERVICES_KEY].alerts.list_silences(include_expired=query.include_expired)
    return json_response(silence_list_view(silences))


async def expire_silence(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    return json_response(silence_view(await request.app[SERVICES_KEY].alerts.expire_silence(request.match_info["silence_id"])))


async def create_webhook(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateWebhook)
    principal = scope_of(request).principal
    record = await request.app[SERVICES_KEY].alerts.create_webhook(body.url, owner=principal.account, role=principal.role.value)
    return json_response(created_webhook_view(record), status=201)


async def list_webhooks(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    page = await request.app[SERVICES_KEY].alerts.list_webhooks(
        owner=scope_of(request).owner, after=decode_cursor(WEBHOOKS, query, WebhookKey), limit=query.limit
    )
    return page_response(WEBHOOKS, query, page, webhook_view)


async def delete_webhook(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    await request.app[SERVICES_KEY].alerts.delete_webhook(request.match_info["webhook_id"], owner=scope_of(request).owner)
    return web.Response(status=204)
