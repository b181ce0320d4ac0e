"""Alerts' answers (management/monitoring/): rules with where each comes from, the alerts pending and firing now with
the recent transitions, silences, and webhooks (the secret shown once, in the answer that creates it)."""

from __future__ import annotations

from typing import Literal

from management.monitoring.evaluator import AlertState, AlertTransition
from management.monitoring.rules import AlertRule
from management.monitoring.settings import AlertListing, RuleListing
from management.views.base import Time, View, rfc3339
from master.port import SilenceRecord, WebhookRecord


class AlertRuleView(View):
    name: str
    metric: str
    op: str
    threshold: float
    for_s: float
    clear_threshold: float | None
    clear_for_s: float
    severity: str
    scope: str
    fault: bool
    summary: str
    source: Literal["file", "api"]


class AlertRuleList(View):
    items: list[AlertRuleView]


class DeletedAlertRule(View):
    deleted: str
    applies_now: AlertRuleView | None  # the rules file's rule of that name, which applies again


class AlertView(View):
    rule: str
    subject: str
    phase: str
    since: Time
    value: float
    fired_at: Time | None
    labels: dict[str, str]


class AlertTransitionView(View):
    key: str
    rule: str
    subject: str
    phase: str
    at: Time
    since: Time
    fired_at: Time
    value: float | None
    severity: str
    scope: str
    summary: str
    labels: dict[str, str]


class AlertList(View):
    items: list[AlertView]  # pending and firing now
    recent: list[AlertTransitionView]  # the latest transitions, newest first


class SilenceView(View):
    id: str
    rule: str | None
    subject: str | None
    labels: dict[str, str]
    comment: str
    created_by: str
    created_at: Time
    expires_at: Time


class SilenceList(View):
    items: list[SilenceView]


class WebhookView(View):
    id: str
    url: str
    owner: str
    role: str
    created_at: Time


class CreatedWebhook(WebhookView):
    secret: str  # shown this once: it signs every delivery (X-Idlegrid-Signature: sha256=HMAC-SHA256(secret, body))


class WebhookList(View):
    items: list[WebhookView]
    next_cursor: str | None  # pass it back as ``cursor`` for the next page; null on the last


def _time(ts: float) -> str:
    return rfc3339(ts) or rfc3339(1e-3) or ""


def rule_view(listing: RuleListing) -> AlertRuleView:
    rule: AlertRule = listing.rule
    fields = {f: getattr(rule, f) for f in rule.__struct_fields__}
    return AlertRuleView(**fields, source="api" if listing.source == "api" else "file")


def alert_view(state: AlertState) -> AlertView:
    return AlertView(
        rule=state.rule,
        subject=state.subject,
        phase=state.phase,
        since=_time(state.since),
        value=state.value,
        fired_at=None if state.fired_at is None else _time(state.fired_at),
        labels=state.labels,
    )


def transition_view(t: AlertTransition) -> AlertTransitionView:
    return AlertTransitionView(
        key=t.key,
        rule=t.rule,
        subject=t.subject,
        phase=t.phase,
        at=_time(t.at),
        since=_time(t.since),
        fired_at=_time(t.fired_at),
        value=t.value,
        severity=t.severity,
        scope=t.scope,
        summary=t.summary,
        labels=t.labels,
    )


def silence_view(s: SilenceRecord) -> SilenceView:
    return SilenceView(
        id=s.id,
        rule=s.rule,
        subject=s.subject,
        labels=s.labels,
        comment=s.comment,
        created_by=s.created_by,
        created_at=_time(s.created_at),
        expires_at=_time(s.expires_at),
    )


def webhook_view(w: WebhookRecord) -> WebhookView:
    return WebhookView(id=w.id, url=w.url, owner=w.owner, role=w.role, created_at=_time(w.created_at))


def rule_list_view(listings: list[RuleListing]) -> AlertRuleList:
    return AlertRuleList(items=[rule_view(listing) for listing in listings])


def deleted_rule_view(name: str, shipped: RuleListing | None) -> DeletedAlertRule:
    """A rule deleted through the API, and the rules file's rule of that name, which applies again (None: none)."""
    return DeletedAlertRule(deleted=name, applies_now=None if shipped is None else rule_view(shipped))


def alert_list_view(listing: AlertListing) -> AlertList:
    return AlertList(items=[alert_view(s) for s in listing.active], recent=[transition_view(t) for t in listing.recent])


def silence_list_view(silences: list[SilenceRecord]) -> SilenceList:
    return SilenceList(items=[silence_view(s) for s in silences])


def created_webhook_view(w: WebhookRecord) -> CreatedWebhook:
    """A webhook just created: its view and its secret, shown this once."""
    view = webhook_view(w)
    return CreatedWebhook(**{f: getattr(view, f) for f in view.__struct_fields__}, secret=w.secret)
