"""Alerts in the console: what fires now and what fired or resolved lately, for every role (each sees what the
façade's viewer filtering lets it: the operator every alert, a provider its hosts' and their GPUs', a renter its
workloads'), and silences, the operator's (a form with an expiry, the silences in force, ending one early).

The top half is pure (façade answers to rows a template shows, the silence form read into fields), tested without a
server; the handlers make their façade calls with the scope auth.py decides for the signed-in account.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, urlencode

import msgspec
from aiohttp import web

from management.access_control import Action, Resource, permitted
from management.console.forms import FormErrors, FormFields, text
from management.console.nav import NavItem
from management.console.pages.operator import parse_fields
from management.console.rendering import TemplateContext, nav_counts, page
from management.console.session import flash, signed_in
from management.console.templating import duration, when
from management.http.keys import SERVICES_KEY
from management.monitoring.evaluator import AlertState, AlertTransition
from management.monitoring.settings import MAX_SILENCE_S, RuleListing
from master.port import SilenceRecord

REFRESH_S = 5  # the alerts page's lists refresh (htmx) this often
RECENT_SHOWN = 50  # transitions listed on the page (the loop keeps the last thousand)
RULE_NAME = re.compile(r"^[a-z0-9_]{1,64}\Z")
SUBJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
LABEL = re.compile(r"^([a-z_]{1,32})=(.{0,128})\Z")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\Z")
UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


# --- pure: façade answers to what the templates show --------------------------------------------------------------


class AlertFilters(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The alerts page's filters, as its form sends them (an empty field is no filter)."""

    severity: Literal["info", "warning", "critical"] | None = None
    phase: Literal["pending", "firing", "resolved"] | None = None


@dataclass(frozen=True)
class AlertRow:
    rule: str
    severity: str
    summary: str
    phase: str
    subject: str
    link: str | None  # the subject's console page, where the viewer has one
    since: str
    lasting: str  # how long the condition has held
    value: str
    silence_link: str  # the silence form, filled in for this alert (shown to the operator)


@dataclass(frozen=True)
class TransitionRow:
    at: str
    phase: str  # "firing" | "resolved"
    rule: str
    severity: str
    summary: str
    subject: str
    link: str | None
    value: str


def shown_value(value: float | None, metric: str) -> str:
    """A rule's metric value for a person: "91 °C", "3.5%", "12 min", "1" ("-" for none)."""
    if value is None:
        return "-"
    if metric.endswith("_c"):
        return f"{value:.0f} °C"
    if metric.endswith("_pct"):
        return f"{value:.1f}%"
    if metric.endswith("_s"):
        return duration(value)
    return f"{value:g}"


def subject_link(subject: str, scope: str, labels: Mapping[str, str], role: str) -> str | None:
    """Where the console shows an alert's subject to ``role``: a GPU's or host's alert links its host's page (the
    provider's and the operator's), a rented GPU's or workload's links the workload's page (the renter's)."""
    if role == "renter":
        workload = labels.get("workload") or (subject if scope == "workload" else "")
        return f"/console/workloads/{quote(workload, safe='')}" if workload else None
    host = labels.get("agent_id") or (subject if scope == "host" else "")
    return f"/console/hosts/{quote(host, safe='')}" if host else None


def alert_rows(states: Sequence[AlertState], rules: Mapping[str, RuleListing], role: str, now: float) -> list[AlertRow]:
    rows = []
    for state in states:
        listing = rules.get(state.rule)
        rule_scope = listing.rule.scope if listing else "gpu"
        rows.append(
            AlertRow(
                rule=state.rule,
                severity=listing.rule.severity if listing else "-",
                summary=listing.rule.summary if listing else "",
                phase=state.phase,
                subject=state.subject,
                link=subject_link(state.subject, rule_scope, state.labels, role),
                since=when(state.since),
                lasting=duration(max(0.0, now - state.since)),
                value=shown_value(state.value, listing.rule.metric if listing else ""),
                silence_link="/console/silences?" + urlencode({"rule": state.rule, "subject": state.subject}),
            )
        )
    return rows


def transition_rows(
    transitions: Sequence[AlertTransition], rules: Mapping[str, RuleListing], role: str, *, limit: int = RECENT_SHOWN
) -> list[TransitionRow]:
    rows = []
    for t in transitions[:limit]:
        listing = rules.get(t.rule)
        rows.append(
            TransitionRow(
                at=when(t.at),
                phase=t.phase,
                rule=t.rule,
                severity=t.severity,
                summary=t.summary,
                subject=t.subject,
                link=subject_link(t.subject, t.scope, t.labels, role),
                value=shown_value(t.value, listing.rule.metric if listing else ""),
            )
        )
    return rows


@dataclass(frozen=True)
class SilenceRequest:
    """A silence form read: what ``AlertsService.create_silence`` takes."""

    duration_s: float
    rule: str | None
    subject: str | None
    labels: dict[str, str]
    comment: str


def parse_duration(value: str) -> float | None:
    """ "90" (minutes), "90m", "2h", "1d", "45s" -> seconds; None when it is none of these."""
    found = DURATION.match(value.strip().lower())
    if found is None:
        return None
    return float(found.group(1)) * UNIT_S[found.group(2) or "m"]


def parse_labels(value: str) -> dict[str, str] | None:
    """ "provider=acme, region=eu-west" -> labels; None when a part is not name=value."""
    labels: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        found = LABEL.match(part)
        if found is None:
            return None
        labels[found.group(1)] = found.group(2).strip()
    return labels


def read_silence_form(form: FormFields, known_rules: Sequence[str]) -> tuple[SilenceRequest | None, FormErrors]:
    """The silence form's fields, each problem beside its field; None when any was found."""
    errors = FormErrors()
    rule = text(form, "rule") or None
    if rule is not None and (not RULE_NAME.match(rule) or rule not in known_rules):
        errors.add("rule", f"rule: {rule[:64]!r} is not one of the alert rules")
    subject = text(form, "subject") or None
    if subject is not None and not SUBJECT.match(subject):
        errors.add("subject", "subject: a GPU uuid, host id or workload id (letters, digits and . _ - : only)")
    labels = parse_labels(text(form, "labels"))
    if labels is None:
        errors.add("labels", "labels: name=value pairs separated by commas, e.g. provider=acme, region=eu-west")
    elif len(labels) > 16:
        errors.add("labels", "labels: at most 16")
    if rule is None and subject is None and not labels and "rule" not in errors and "labels" not in errors:
        errors.add("rule", "name a rule, a subject or labels: a silence without one would silence everything")
    given = text(form, "duration")
    seconds = parse_duration(given) if given else None
    if seconds is None:
        said = f" (not {given[:40]!r})" if given else ""
        errors.add("duration", f"duration: how long, e.g. 30m, 2h or 1d{said}")
    elif not 0 < seconds <= MAX_SILENCE_S:
        errors.add("duration", f"duration: more than 0 and at most {MAX_SILENCE_S / 86400:g} days")
    comment = text(form, "comment", max_length=512)
    if errors:
        return None, errors
    assert seconds is not None and labels is not None
    return SilenceRequest(duration_s=seconds, rule=rule, subject=subject, labels=labels, comment=comment), errors


@dataclass(frozen=True)
class SilenceRow:
    id: str
    matches: str  # what it matches, in words
    comment: str
    created_by: str
    created: str
    expires: str
    left: str


def silence_rows(silences: Sequence[SilenceRecord], now: float) -> list[SilenceRow]:
    rows = []
    for s in sorted(silences, key=lambda s: (s.expires_at, s.id)):
        parts = [f"rule {s.rule}"] if s.rule else []
        parts += [f"subject {s.subject}"] if s.subject else []
        parts += [f"{k}={v}" for k, v in sorted(s.labels.items())]
        rows.append(
            SilenceRow(
                id=s.id,
                matches=", ".join(parts),
                comment=s.comment,
                created_by=s.created_by,
                created=when(s.created_at),
                expires=when(s.expires_at),
                left=duration(max(0.0, s.expires_at - now)),
            )
        )
    return rows


# --- the pages --------------------------------------------------------------------------------------------------


async def alerts_page(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.ALERTS, Action.READ)
    filters = parse_fields(request.query, AlertFilters, "the filters")
    operations = request.app[SERVICES_KEY]
    role = scope.principal.role.value
    listing = await operations.alerts.list_alerts(owner=scope.owner, role=role, phase=filters.phase, severity=filters.severity)
    rules = {listing.rule.name: listing for listing in await operations.alerts.alert_rules()}
    now = time.time()
    active = alert_rows(listing.active, rules, role, now)
    refresh = bool(request.headers.get("HX-Request"))  # htmx's refresh: the notices are left for the next page
    extra: TemplateContext = {"nav_counts": await nav_counts(request)} if refresh else {}  # the nav's count too
    return await page(
        request,
        "alerts/alerts.html",
        fragment=refresh,
        **extra,
        title="Alerts",
        live_url=request.path_qs,
        refresh_s=REFRESH_S,
        as_of=when(now),
        filters=filters,
        firing=[a for a in active if a.phase == "firing"],
        pending=[a for a in active if a.phase == "pending"],
        recent=transition_rows(listing.recent, rules, role),
        recent_total=len(listing.recent),
        may_silence=permitted(scope.principal.role, Resource.SILENCES, Action.WRITE),
    )


async def silences_page(
    request: web.Request, *, errors: FormErrors | None = None, typed: Mapping[str, str] | None = None
) -> web.StreamResponse:
    await signed_in(request, Resource.SILENCES, Action.READ)
    operations = request.app[SERVICES_KEY]
    silences = await operations.alerts.list_silences()
    rules = [listing.rule.name for listing in await operations.alerts.alert_rules()]
    prefill = {k: text(request.query, k) for k in ("rule", "subject", "labels", "duration", "comment")}
    return await page(
        request,
        "alerts/silences.html",
        status=400 if errors else 200,
        title="Silences",
        silences=silence_rows(silences, time.time()),
        rules=rules,
        errors=errors or FormErrors(),
        typed={"duration": "2h", **{k: v for k, v in prefill.items() if v}, **(typed or {})},
    )


async def create_silence(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.SILENCES, Action.WRITE)
    form = await request.post()
    operations = request.app[SERVICES_KEY]
    rules = [listing.rule.name for listing in await operations.alerts.alert_rules()]
    wanted, errors = read_silence_form(form, rules)
    if wanted is None:
        typed = {k: text(form, k) for k in ("rule", "subject", "labels", "duration", "comment")}
        return await silences_page(request, errors=errors, typed=typed)
    silence = await operations.alerts.create_silence(
        by=scope.principal.account,
        duration_s=wanted.duration_s,
        rule=wanted.rule,
        subject=wanted.subject,
        labels=wanted.labels,
        comment=wanted.comment,
    )
    await flash(request, f"Silence {silence.id} holds back matching notifications until {when(silence.expires_at)} UTC.")
    raise web.HTTPSeeOther("/console/silences")


async def expire_silence(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.SILENCES, Action.WRITE)
    ended = await request.app[SERVICES_KEY].alerts.expire_silence(request.match_info["silence_id"])
    await flash(request, f"Silence {ended.id} has ended: matching alerts are notified again.")
    raise web.HTTPSeeOther("/console/silences")


NAV = [
    NavItem("operator", "Alerts", "/console/alerts", 15, badge="alerts"),
    NavItem("operator", "Silences", "/console/silences", 16),
    NavItem("provider", "Alerts", "/console/alerts", 15, badge="alerts"),
    NavItem("renter", "Alerts", "/console/alerts", 45, badge="alerts"),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/alerts", alerts_page)
    router.add_get("/console/silences", silences_page)
    router.add_post("/console/silences", create_silence)
    router.add_post("/console/silences/{silence_id}/expire", expire_silence)
