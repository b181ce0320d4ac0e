"""The provider's pages: my hosts (the operator's "all hosts" too), a host with its GPUs, reputation, live charts,
drain and undrain and its price, and earnings with payout statements.

The top half is pure: functions from what the façade answers to what a template shows (tested without a server).
The handlers below make one façade call each for what they show, with the scope auth.py decides for the signed-in
account: a provider's lists hold its own hosts only, and another provider's host answers 404.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import msgspec
from aiohttp import web

from common.inventory import GpuReach, GpuSample
from management.access_control import Action, Resource, permitted
from management.console.assets import vendor_available
from management.console.nav import NavItem
from management.console.rendering import TemplateContext, page
from management.console.session import flash, signed_in
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, encode_cursor
from management.http.schemas import AGENT_STATES, AccountName, Cursor, Identifier, PageQuery
from management.market.money import format_amount
from management.market.prices import HostPrice, PriceSetting
from management.services.hosts import AgentDetail, AgentKey
from management.services.telemetry import HostSamples
from management.views.verification import host_verifications_view
from master.port import WEIGHTS, GpuRecord, reputation

HOSTS_PAGE = 50  # hosts on a page of the list
PAYOUT_PERIODS = ("day", "week", "month")
EVIDENCE_SAID = {  # a reputation's evidence counters, for people
    "uptime_s": "seconds answering",
    "downtime_s": "seconds silent",
    "commands_succeeded": "commands carried out",
    "commands_failed": "commands failed",
    "containers_started": "containers started",
    "containers_failed": "containers that failed to start",
    "rentals_completed": "rentals ended well",
    "rentals_failed": "rentals failed through the host",
    "ratings_count": "ratings",
    "rating_mean": "mean rating (1 to 5)",
    "gpus_verified": "GPUs verified",
    "gpus_unverified": "GPUs no tier matched",
    "gpus_flagged": "GPUs flagged",
}
COMPONENT_EVIDENCE = {  # which evidence each component is computed from
    "uptime": ("uptime_s", "downtime_s"),
    "command_success": ("commands_succeeded", "commands_failed"),
    "container_success": ("containers_started", "containers_failed"),
    "rentals": ("rentals_completed", "rentals_failed"),
    "verification": ("gpus_verified", "gpus_unverified", "gpus_flagged"),
    "ratings": ("ratings_count", "rating_mean"),
}


class HostQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    """The hosts list's filters, as the form sends them (an empty field is no filter)."""

    limit: int = HOSTS_PAGE
    state: Identifier | None = None
    tier: Identifier | None = None
    region: AccountName | None = None
    model: Identifier | None = None
    cursor: Cursor | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in AGENT_STATES:
            raise ValueError(f"state {self.state!r} is not one of: {', '.join(AGENT_STATES)}")
        if not 1 <= self.limit <= 200:
            raise ValueError("limit must be from 1 to 200")

    def filters(self) -> dict[str, str]:
        """The filters given, for links to the next page (a cursor is valid only with the same filters)."""
        return {name: value for name in ("state", "tier", "region", "model") if (value := getattr(self, name)) is not None}


def host_query(params: Mapping[str, str]) -> HostQuery:
    """The query string as a HostQuery; ValueError (msgspec.ValidationError) naming a field that is wrong."""
    given = {name: value.strip() for name, value in params.items() if value.strip()}
    return msgspec.convert(given, HostQuery, strict=False)


# --- rows and figures -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRow:
    id: str
    provider: str
    region: str
    state: str
    drained: bool
    tiers: str  # the tiers of its GPUs, e.g. "premium x 8"
    models: str
    gpus: int
    gpu_states: str  # e.g. "6 available, 2 busy"
    faulty: int
    reputation: float


def counted(values: Iterable[str]) -> str:
    """``["a", "a", "b"]`` -> ``"a x 2, b"``: each value once, in first-seen order, with how often it occurs."""
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(name if n == 1 else f"{name} x {n}" for name, n in counts.items())


def host_row(detail: AgentDetail) -> HostRow:
    agent, gpus = detail.agent, detail.gpus
    states: dict[str, int] = {}
    for gpu in gpus:
        states[gpu.state] = states.get(gpu.state, 0) + 1
    return HostRow(
        id=agent.id,
        provider=agent.provider,
        region=agent.region or "-",
        state=agent.state,
        drained=agent.drained,
        tiers=counted(g.tier or "untiered" for g in gpus) or "-",
        models=counted(g.model or "unknown" for g in gpus) or "-",
        gpus=len(gpus),
        gpu_states=", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none",
        faulty=states.get("faulty", 0),
        reputation=reputation(agent).score,
    )


@dataclass(frozen=True)
class ReputationPart:
    name: str
    value: float
    weight: float
    evidence: list[tuple[str, str]]  # (what, how much), for people


def reputation_parts(detail: AgentDetail) -> tuple[float, list[ReputationPart]]:
    """The host's score and each component with its weight and the evidence it is computed from."""
    rep = reputation(detail.agent)
    parts = []
    for name in WEIGHTS:
        evidence = [
            (EVIDENCE_SAID[key], _number(rep.evidence[key])) for key in COMPONENT_EVIDENCE.get(name, ()) if key in rep.evidence
        ]
        parts.append(ReputationPart(name.replace("_", " "), rep.components[name], rep.weights[name], evidence))
    return rep.score, parts


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


@dataclass(frozen=True)
class GpuRow:
    uuid: str
    index: int
    name: str
    model: str
    tier: str
    state: str
    memory_total_mib: int
    fault: str  # why it is faulty, "" when it is not
    held_by: str
    offered: bool
    now: dict[str, str]  # the latest sample's figures as text: utilization, memory, temperature, power
    selftest: str = "not tested"  # the agent's GPU self-test: "reaches a container", "does not reach", "not tested"
    selftest_detail: str = ""  # what the self-test saw, when the GPU did not reach a container
    selftest_fix: str = ""  # and what the provider does about it
    partition: str = ""  # an AMD card's partition modes ("SPX, NPS1 (can be ...)"): shown, not sold; "" for none


def sample_figures(sample: GpuSample | None, memory_total_mib: int) -> dict[str, str]:
    """A sample's four charted figures as text, each "-" when not reported."""
    if sample is None:
        return {"utilization": "-", "memory": "-", "temperature": "-", "power": "-"}
    return {
        "utilization": f"{sample.utilization_pct:.0f}%",
        "memory": f"{sample.memory_used_mib:,} of {memory_total_mib:,} MiB",
        "temperature": f"{sample.temperature_c:.0f} °C" if sample.temperature_c is not None else "-",
        "power": f"{sample.power_w:.0f} W" if sample.power_w is not None else "-",
    }


def gpu_rows(detail: AgentDetail) -> list[GpuRow]:
    reach = {r.uuid: r for r in detail.agent.gpu_reach}
    return [
        GpuRow(
            uuid=g.uuid,
            index=g.index,
            name=g.info.name,
            model=g.model or "unknown",
            tier=g.tier or "untiered",
            state=g.state,
            memory_total_mib=g.info.memory_total_mib,
            fault=g.fault.reason if g.fault is not None else "",
            held_by=detail.holders.get(g.uuid, ""),
            offered=g.uuid in detail.offered,
            now=sample_figures(detail.latest.get(g.uuid), g.info.memory_total_mib),
            selftest=_selftest_said(reach.get(g.uuid)),
            selftest_detail=reach[g.uuid].detail if g.uuid in reach and not reach[g.uuid].reachable else "",
            selftest_fix=reach[g.uuid].fix if g.uuid in reach and not reach[g.uuid].reachable else "",
            partition=g.info.partition.describe() if g.info.partition is not None else "",
        )
        for g in sorted(detail.gpus, key=lambda g: (g.index, g.uuid))
    ]


def _selftest_said(reach: GpuReach | None) -> str:
    if reach is None:
        return "not tested"
    return "reaches a container" if reach.reachable else "does not reach"


# --- live samples: what the charts poll -------------------------------------------------------------------------

CHARTED = ("utilization_pct", "memory_used_mib", "temperature_c", "power_w")


def samples_document(found: HostSamples) -> TemplateContext:
    """The host's recent samples per GPU as columns a chart draws (uPlot's [xs, ys]): times in unix seconds, a
    figure not reported is null; with the latest figures as text."""
    gpus = []
    for gpu in sorted(found.gpus, key=lambda g: (g.index, g.uuid)):
        samples: Sequence[GpuSample] = found.samples.get(gpu.uuid, [])
        gpus.append(
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "model": gpu.model or "unknown",
                "memory_total_mib": gpu.info.memory_total_mib,
                "ts": [s.ts for s in samples],
                **{name: [getattr(s, name) for s in samples] for name in CHARTED},
                "now": sample_figures(samples[-1] if samples else None, gpu.info.memory_total_mib),
            }
        )
    return {"agent_id": found.agent_id, "gpus": gpus}


# --- prices and earnings ----------------------------------------------------------------------------------------


def price_terms(price: HostPrice) -> dict[str, str]:
    """A price's terms as text (amounts per GPU-hour)."""
    return {
        "on_demand": format_amount(price.on_demand),
        "min_bid": format_amount(price.min_bid) if price.min_bid is not None else "",
        "reserved_discount": f"{price.reserved_discount:g}",
        "reserved": format_amount(price.reserved),
        "max_duration_h": f"{price.max_duration_s / 3600:g}" if price.max_duration_s is not None else "",
        "source": {"host": "this host's own", "provider": "your default", "grid": "the grid's default"}.get(
            price.source, price.source
        ),
    }


@dataclass(frozen=True)
class EarningsRow:
    label: str  # the host, or the period ("2026-11-23", "2026-W47", "2026-11")
    gross: str
    fee: str
    refunded: str
    net: str


def earnings_rows(items: Sequence[Any], *, label: str) -> list[EarningsRow]:
    """Per-host or per-period earnings (HostEarnings, PeriodEarnings: amounts in micro-units) as text."""
    return [
        EarningsRow(
            label=str(getattr(item, label)),
            gross=format_amount(item.gross),
            fee=format_amount(item.fee),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in items
    ]


def earnings_series(periods: Sequence[Any]) -> TemplateContext:
    """Net earnings per period for a chart: period starts (unix seconds), net amounts in currency units, and how long
    a period is (the chart pads its time axis by one, so a single period is a bar, not a point in years of axis)."""
    span = max((p.end - p.start for p in periods), default=86400.0)
    return {"ts": [p.start for p in periods], "net": [p.net / 1_000_000 for p in periods], "span": span}


def earnings_total(periods: Sequence[Any]) -> str:
    return format_amount(sum(p.net for p in periods))


def when(ts: float | None) -> str:
    """A moment for people: "2026-11-23 02:15:07 UTC"; "-" for never."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gpu_label(gpu: GpuRecord) -> str:
    return f"GPU {gpu.index} ({gpu.model or gpu.info.name})"


# --- the pages --------------------------------------------------------------------------------------------------

HOSTS_CURSOR = "console-hosts"  # the cursor's list name: a cursor of the API's lists is refused here


def _query(request: web.Request) -> HostQuery:
    try:
        return host_query(request.query)
    except (msgspec.ValidationError, ValueError) as exc:
        raise BadRequest(f"the filters: {exc}") from None


async def hosts_page(request: web.Request) -> web.StreamResponse:
    """My hosts (a provider's) or all hosts (the operator's), filtered and paged on the server."""
    scope = await signed_in(request, Resource.AGENTS, Action.READ)
    query = _query(request)
    operations = request.app[SERVICES_KEY]
    found = operations.hosts.list_agents(
        state=query.state,
        tier=query.tier,
        region=query.region,
        model=query.model,
        owner=scope.owner,
        after=decode_cursor(HOSTS_CURSOR, query, AgentKey),
        limit=query.limit,
    )
    kept = {**query.filters(), **({"limit": str(query.limit)} if query.limit != HOSTS_PAGE else {})}
    next_link = None
    if found.next_key is not None:
        next_link = "?" + urlencode({**kept, "cursor": encode_cursor(HOSTS_CURSOR, query, found.next_key)})
    return await page(
        request,
        "provider/hosts.html",
        title="My hosts" if scope.owner is not None else "All hosts",
        query=query,
        choices=operations.hosts.host_choices(owner=scope.owner),
        states=AGENT_STATES,
        rows=[host_row(d) for d in found.items],
        next_link=next_link,
        first_link="?" + urlencode(kept) if query.cursor else None,
        operator=scope.owner is None,
    )


async def host_page(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.AGENTS, Action.READ)
    agent_id = request.match_info["agent_id"]
    operations = request.app[SERVICES_KEY]
    detail = operations.hosts.get_agent(agent_id, owner=scope.owner)
    price = await operations.prices.host_price(agent_id)
    role = scope.principal.role
    earned: list[EarningsRow] = []
    if permitted(role, Resource.LEDGER, Action.READ):
        earnings = await operations.market.earnings(detail.agent.provider, owner=scope.owner)
        earned = earnings_rows([e for e in earnings.items if e.agent_id == agent_id], label="agent_id")
    score, parts = reputation_parts(detail)
    verification = host_verifications_view(await operations.verification.history(agent_id, owner=scope.owner))
    return await page(
        request,
        "provider/host.html",
        verification=verification,
        title=f"Host {agent_id}",
        agent=detail.agent,
        reachable=detail.reachable,
        last_seen=when(detail.agent.last_seen),
        gpus=gpu_rows(detail),
        workloads=detail.workloads,
        score=score,
        parts=parts,
        price=price_terms(price.price),
        currency=price.currency,
        earned=earned,
        completion=operations.market.completion(agent_id, owner=scope.owner),
        may_maintain=permitted(role, Resource.AGENTS, Action.MAINTAIN),
        may_price=permitted(role, Resource.PRICES, Action.WRITE),
        may_revoke=permitted(role, Resource.AGENTS, Action.WRITE),
        charts_available=vendor_available(),
    )


async def host_samples(request: web.Request) -> web.StreamResponse:
    """The JSON the host page's charts poll: each GPU's recent samples."""
    scope = await signed_in(request, Resource.AGENTS, Action.READ)
    found = request.app[SERVICES_KEY].telemetry.recent_samples(request.match_info["agent_id"], owner=scope.owner)
    return web.Response(body=msgspec.json.encode(samples_document(found)), content_type="application/json")


def _back_to_host(agent_id: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(f"/console/hosts/{quote(agent_id, safe='')}")


async def drain_host(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.AGENTS, Action.MAINTAIN)
    detail = await request.app[SERVICES_KEY].hosts.drain(request.match_info["agent_id"], owner=scope.owner)
    await flash(request, f"Host {detail.agent.id} is drained: it takes no new work; what runs there goes on.")
    raise _back_to_host(detail.agent.id)


async def undrain_host(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.AGENTS, Action.MAINTAIN)
    detail = await request.app[SERVICES_KEY].hosts.undrain(request.match_info["agent_id"], owner=scope.owner)
    await flash(request, f"Host {detail.agent.id} is undrained: it takes work again ({detail.agent.state}).")
    raise _back_to_host(detail.agent.id)


class PriceForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The host price form: amounts per GPU-hour as decimal text, an empty field left out."""

    csrf_token: str = ""
    on_demand: str
    min_bid: str | None = None
    reserved_discount: float = 0.0
    max_duration_h: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.reserved_discount):
            raise ValueError("reserved_discount must be a number from 0 to 0.9")
        if self.max_duration_h is not None and not (math.isfinite(self.max_duration_h) and self.max_duration_h >= 1):
            raise ValueError("max_duration_h must be at least 1 hour, or empty for no limit")

    def setting(self) -> PriceSetting:
        hours = self.max_duration_h
        return PriceSetting(
            on_demand=self.on_demand,
            min_bid=self.min_bid,
            reserved_discount=self.reserved_discount,
            max_duration_s=hours * 3600 if hours is not None else None,
        )


def price_form(fields: Mapping[str, str]) -> PriceForm:
    """The form as a PriceForm; BadRequest naming the field that is missing or wrong."""
    given = {name: value.strip() for name, value in fields.items() if value.strip()}
    try:
        return msgspec.convert(given, PriceForm, strict=False)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"the price: {exc}") from None


async def set_host_price(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.PRICES, Action.WRITE)
    form = price_form({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
    detail = await request.app[SERVICES_KEY].prices.set_host_price(
        request.match_info["agent_id"], form.setting(), owner=scope.owner
    )
    terms = price_terms(detail.price)
    await flash(request, f"Host {detail.agent_id} now costs {terms['on_demand']} {detail.currency} per GPU-hour on demand.")
    raise _back_to_host(detail.agent_id)


async def clear_host_price(request: web.Request) -> web.StreamResponse:
    """The host goes back to its provider's default price (or the grid's)."""
    scope = await signed_in(request, Resource.PRICES, Action.WRITE)
    detail = await request.app[SERVICES_KEY].prices.clear_host_price(request.match_info["agent_id"], owner=scope.owner)
    terms = price_terms(detail.price)
    await flash(request, f"Host {detail.agent_id} has no price of its own: {terms['source']} applies ({terms['on_demand']}).")
    raise _back_to_host(detail.agent_id)


async def earnings_page(request: web.Request) -> web.StreamResponse:
    """Earnings over time (net per period, a chart and its table), per host, and payout statements per period."""
    scope = await signed_in(request, Resource.LEDGER, Action.READ)
    period = request.query.get("period", "day")
    if period not in PAYOUT_PERIODS:
        raise BadRequest(f"period must be one of {', '.join(PAYOUT_PERIODS)}, not {period!r}")
    provider = scope.owner or request.query.get("provider", "").strip()
    context: TemplateContext = {"period": period, "periods": PAYOUT_PERIODS, "provider": provider, "ask_provider": False}
    if not provider:  # the operator names the provider whose earnings to see
        return await page(request, "provider/earnings.html", title="Earnings", **{**context, "ask_provider": True})
    market = request.app[SERVICES_KEY].market
    per_host = await market.earnings(provider, owner=scope.owner)
    payouts = await market.payouts(provider, period, owner=scope.owner)
    return await page(
        request,
        "provider/earnings.html",
        title="Earnings",
        **context,
        currency=payouts.currency,
        hosts=earnings_rows(per_host.items, label="agent_id"),
        statements=earnings_rows(payouts.items, label="label"),
        total=earnings_total(payouts.items),
        series=msgspec.json.encode(earnings_series(payouts.items)).decode(),
        charts_available=vendor_available(),
    )


NAV = [
    NavItem("provider", "My hosts", "/console/hosts", 10),
    NavItem("provider", "Earnings", "/console/earnings", 20),
    NavItem("operator", "All hosts", "/console/hosts", 20),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/hosts", hosts_page)
    router.add_get("/console/hosts/{agent_id}", host_page)
    router.add_get("/console/hosts/{agent_id}/samples", host_samples)
    router.add_post("/console/hosts/{agent_id}/drain", drain_host)
    router.add_post("/console/hosts/{agent_id}/undrain", undrain_host)
    router.add_post("/console/hosts/{agent_id}/price", set_host_price)
    router.add_post("/console/hosts/{agent_id}/price/clear", clear_host_price)
    router.add_get("/console/earnings", earnings_page)
