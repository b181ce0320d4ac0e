"""The provider's pages: my hosts (the operator's "all hosts" too), a host with its GPUs, reputation, live charts,
drain and undrain and its price, and earnings with payout statements.

The top half is pure: functions from what the façade answers to what a template shows (tested without a server).
The handlers below make one façade call each for what they show, with the scope auth.py decides for the signed-in
account: a provider's lists hold its own hosts only, and another provider's host answers 404.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from common.inventory import GpuSample
from management.api.schemas import AGENT_STATES, AccountName, Cursor, Identifier, PageQuery
from management.market.money import format_amount
from management.market.prices import HostPrice
from management.operations import AgentDetail, HostSamples
from master.records import GpuRecord
from master.reputation import WEIGHTS, reputation

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
        )
        for g in sorted(detail.gpus, key=lambda g: (g.index, g.uuid))
    ]


# --- live samples: what the charts poll -------------------------------------------------------------------------

CHARTED = ("utilization_pct", "memory_used_mib", "temperature_c", "power_w")


def samples_document(found: HostSamples) -> dict[str, Any]:
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


def earnings_series(periods: Sequence[Any]) -> dict[str, list[float]]:
    """Net earnings per period for a chart: period starts (unix seconds) and net amounts in currency units."""
    return {"ts": [p.start for p in periods], "net": [p.net / 1_000_000 for p in periods]}


def earnings_total(periods: Sequence[Any]) -> str:
    return format_amount(sum(p.net for p in periods))


def when(ts: float | None) -> str:
    """A moment for people: "2026-11-23 02:15:07 UTC"; "-" for never."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gpu_label(gpu: GpuRecord) -> str:
    return f"GPU {gpu.index} ({gpu.model or gpu.info.name})"
