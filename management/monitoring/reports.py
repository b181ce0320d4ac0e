"""Reports: the grid's figures along any dimension it records, as rows a person or a spreadsheet reads.

A report is a pure function (``build_report``) of records read elsewhere (``ReportInputs``): the registry's hosts and
GPUs, one-minute telemetry rollups, rentals, ledger entries and commands, over a window ``[start, end)``. Each figure
comes from one source, so each can be checked against it:

- ``gpu_hours_available``: GPU-minutes that reported telemetry (a rollup), / 60. ``gpu_hours_idle``: those of them no
  rental held. ``utilization_pct``: the mean of those minutes' average utilization. ``uptime_pct``: the minutes that
  reported out of those the registered GPUs could have reported (from their host's enrolment; none for the renter and
  workload dimensions, which GPUs do not have while no one rents them).
- ``gpu_hours_sold``: rentals' GPUs times the time they ran inside the window (what is charged for), split at period
  boundaries.
- ``gross``, ``fees``, ``refunded``, ``fees_refunded``: the ledger's charge and refund lines naming a host, by the
  entry's time; ``provider_net`` = gross - fees - refunded (what the ledger's provider earnings say),
  ``platform_net`` = fees - fees_refunded. Money is integer micro-units here; views render it as decimal strings.
- ``commands_failed``: commands that ended failed or timed out, by when they ended. ``rentals_started``,
  ``rentals_ended``: rental hosts (a rental on two hosts counts once on each) whose rental started or ended in the
  window. ``sla_breaches``: rental hosts whose rental ended through that host (``RentalRecord.host_failure``: the
  container did not start, the host went offline, a GPU became faulty; the renter was refunded).

Every figure is a sum over records, each record landing in exactly one row, so the rows always sum to the total.
Money split over a host's GPUs of several tiers or models is split in integers with the remainder on the first, so
sums stay exact.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from common.errors import IdlegridError
from management.market.ledger import FEES, calendar_period
from master.port import CommandRecord, LedgerEntry, LedgerLine, RentalRecord, TelemetryRollup

DIMENSIONS: tuple[str, ...] = ("provider", "host", "tier", "model", "region", "renter", "workload", "day", "week", "month")
TIME_DIMENSIONS = frozenset({"day", "week", "month"})
MAX_DIMENSIONS = 3
NONE = "-"  # the value of a dimension a record does not have (an idle GPU's renter, a command's tier)

USAGE = ("gpu_hours_available", "gpu_hours_sold", "gpu_hours_idle", "utilization_pct", "uptime_pct")
REVENUE = ("gross", "fees", "refunded", "fees_refunded", "provider_net", "platform_net")
RELIABILITY = ("uptime_pct", "commands_failed", "rentals_started", "rentals_ended", "sla_breaches")
KINDS: dict[str, tuple[str, ...]] = {
    "usage": USAGE,
    "revenue": REVENUE,
    "reliability": RELIABILITY,
    "summary": USAGE + REVENUE + RELIABILITY[1:],
}
MONEY_COLUMNS = frozenset(REVENUE)
FAILED_COMMAND_STATES = frozenset({"failed", "timed_out"})


class InvalidReport(ValueError):
    """A report asked along dimensions, or over a window, it cannot have (the message names which)."""


class HiddenDimension(IdlegridError):
    """A provider asked for its report by renter or by workload: who rents a provider's hosts, and what they run, are
    the renter's, hidden from providers everywhere (a rental's view leaves them out the same way)."""

    code = "bad_request"


RENTERS_OWN_DIMENSIONS = ("renter", "workload")  # never shown to a provider (docs/market.md, "Who sees the renter")


def check_provider_dimensions(by: Sequence[str]) -> None:
    """HiddenDimension when ``by`` names a dimension that is the renter's."""
    hidden = [d for d in by if d in RENTERS_OWN_DIMENSIONS]
    if hidden:
        allowed = ", ".join(d for d in DIMENSIONS if d not in RENTERS_OWN_DIMENSIONS)
        raise HiddenDimension(
            f"by: {', '.join(hidden)} is the renter's and not shown to providers (as in rental views); group by {allowed}"
        )


@dataclass(frozen=True)
class HostFacts:
    provider: str
    region: str
    enrolled_at: float = 0.0


@dataclass(frozen=True)
class GpuFacts:
    uuid: str
    agent_id: str
    tier: str
    model: str


@dataclass(frozen=True)
class ReportInputs:
    """What a report is computed from: records already limited to what the caller may see (``restrict``)."""

    hosts: Mapping[str, HostFacts]
    gpus: Sequence[GpuFacts]
    rollups: Sequence[TelemetryRollup]
    rentals: Sequence[RentalRecord]
    entries: Sequence[LedgerEntry]
    commands: Sequence[CommandRecord]


@dataclass
class Figures:
    """One row's figures (or the total's). Time is kept in GPU-minutes and GPU-seconds, money in micro-units."""

    gpu_minutes_available: int = 0
    gpu_minutes_idle: int = 0
    gpu_minutes_expected: int = 0
    utilization_sum: float = 0.0
    gpu_seconds_sold: float = 0.0
    gross: int = 0
    fees: int = 0
    refunded: int = 0
    fees_refunded: int = 0
    commands_failed: int = 0
    rentals_started: int = 0
    rentals_ended: int = 0
    sla_breaches: int = 0
    uptime_known: bool = True

    def add(self, other: Figures) -> None:
        for name in Figures.__dataclass_fields__:
            if name != "uptime_known":
                setattr(self, name, getattr(self, name) + getattr(other, name))
        self.uptime_known = self.uptime_known and other.uptime_known

    def column(self, name: str) -> float | int | None:
        """The figure a report column shows: hours rounded to 4 places, percentages to 2, money in micro-units."""
        if name == "gpu_hours_available":
            return round(self.gpu_minutes_available / 60, 4)
        if name == "gpu_hours_idle":
            return round(self.gpu_minutes_idle / 60, 4)
        if name == "gpu_hours_sold":
            return round(self.gpu_seconds_sold / 3600, 4)
        if name == "utilization_pct":
            return round(self.utilization_sum / self.gpu_minutes_available, 2) if self.gpu_minutes_available else None
        if name == "uptime_pct":
            if not self.uptime_known or not self.gpu_minutes_expected:
                return None
            return round(100 * min(self.gpu_minutes_available, self.gpu_minutes_expected) / self.gpu_minutes_expected, 2)
        if name == "provider_net":
            return self.gross - self.fees - self.refunded
        if name == "platform_net":
            return self.fees - self.fees_refunded
        value: int = getattr(self, name)
        return value


@dataclass(frozen=True)
class ReportRow:
    keys: tuple[str, ...]  # the row's value of each dimension, in the report's order
    figures: Figures


@dataclass(frozen=True)
class Report:
    kind: str
    by: tuple[str, ...]
    start: float
    end: float
    columns: tuple[str, ...]
    rows: list[ReportRow]  # sorted by their keys
    total: Figures = field(default_factory=Figures)


def parse_dimensions(text: str) -> tuple[str, ...]:
    """``"provider,day"`` -> ("provider", "day"); InvalidReport naming what is wrong."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise InvalidReport(f"by: name at least one dimension of: {', '.join(DIMENSIONS)}")
    unknown = [n for n in names if n not in DIMENSIONS]
    if unknown:
        raise InvalidReport(f"by: {', '.join(map(repr, unknown))} is not a dimension; use {', '.join(DIMENSIONS)}")
    if len(set(names)) != len(names):
        raise InvalidReport(f"by: {text!r} names a dimension more than once")
    if len(names) > MAX_DIMENSIONS:
        raise InvalidReport(f"by: at most {MAX_DIMENSIONS} dimensions at once, not {len(names)}")
    if len(TIME_DIMENSIONS.intersection(names)) > 1:
        raise InvalidReport("by: at most one of day, week and month at once")
    return names


def restrict(inputs: ReportInputs, *, provider: str | None = None, renter: str | None = None) -> ReportInputs:
    """What a provider (its own hosts' records) or a renter (its own rentals, their GPUs while it rented them, its
    ledger lines) may see; neither given: everything, as the operator sees it."""
    if provider is not None:
        hosts = {a: h for a, h in inputs.hosts.items() if h.provider == provider}
        gpus = [g for g in inputs.gpus if g.agent_id in hosts]
        own = f"provider:{provider}"
        rentals = [
            msgspec.structs.replace(r, hosts=[h for h in r.hosts if h.provider == provider])
            for r in inputs.rentals
            if any(h.provider == provider for h in r.hosts)
        ]
        entries = [
            msgspec.structs.replace(e, lines=[ln for ln in e.lines if _seen_by_provider(ln, own, hosts)])
            for e in inputs.entries
            if any(ln.account == own for ln in e.lines)
        ]
        return ReportInputs(
            hosts=hosts,
            gpus=gpus,
            rollups=[r for r in inputs.rollups if r.agent_id in hosts],
            rentals=rentals,
            entries=entries,
            commands=[c for c in inputs.commands if c.agent_id in hosts],
        )
    if renter is not None:
        rentals = [r for r in inputs.rentals if r.account == renter]
        held = _rented_spans(rentals)
        rollups = [r for r in inputs.rollups if _holder(held, r.gpu_uuid, r.minute * 60.0) is not None]
        accounts = {f"renter:{renter}", f"hold:{renter}"}
        entries = [e for e in inputs.entries if any(ln.account in accounts for ln in e.lines)]
        return ReportInputs(hosts=inputs.hosts, gpus=inputs.gpus, rollups=rollups, rentals=rentals, entries=entries, commands=[])
    return inputs


# --- the aggregation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    start: float
    end: float
    renter: str
    workload: str


def _rented_spans(rentals: Iterable[RentalRecord], until: float = math.inf) -> dict[str, list[_Span]]:
    """GPU uuid -> when rentals held it, and for whom."""
    spans: dict[str, list[_Span]] = defaultdict(list)
    for rental in rentals:
        end = rental.ended_at if rental.ended_at is not None else until
        for host in rental.hosts:
            for unit in host.units:
                spans[unit].append(_Span(rental.started_at, end, rental.account, rental.workload_id))
    return spans


def _holder(spans: Mapping[str, list[_Span]], uuid: str, t: float) -> _Span | None:
    for span in spans.get(uuid, ()):
        if span.start <= t < span.end:
            return span
    return None


def _period_label(ts: float, period: str) -> str:
    return calendar_period(ts, period)[2]


def _pieces(start: float, end: float, period: str | None) -> list[tuple[float, float]]:
    """``[start, end)`` cut at the boundaries of ``period`` (none: whole)."""
    if period is None or end <= start:
        return [(start, end)] if end > start else []
    out: list[tuple[float, float]] = []
    t = start
    while t < end:
        boundary = calendar_period(t, period)[1]
        out.append((t, min(boundary, end)))
        t = boundary
    return out


def split_amount(amount: int, parts: int) -> list[int]:
    """``amount`` in ``parts`` integers that sum to it exactly, the remainder on the first."""
    share = int(amount / parts) if amount >= 0 else -int(-amount / parts)
    return [amount - share * (parts - 1)] + [share] * (parts - 1)


def build_report(inputs: ReportInputs, kind: str, by: Sequence[str], start: float, end: float) -> Report:
    """The figures of ``inputs`` over ``[start, end)``, one row per combination of the ``by`` dimensions' values that
    has a record, sorted; the total is the sum of the rows."""
    if kind not in KINDS:
        raise InvalidReport(f"kind {kind!r} is not one of: {', '.join(KINDS)}")
    if not end > start:
        raise InvalidReport("from must be before to")
    by = tuple(by)
    period = next((d for d in by if d in TIME_DIMENSIONS), None)
    rows: dict[tuple[str, ...], Figures] = defaultdict(Figures)
    gpus = {g.uuid: g for g in inputs.gpus}
    hosts = inputs.hosts

    def key(**values: str) -> tuple[str, ...]:
        return tuple(values.get(d) or NONE for d in by)

    def gpu_values(uuid: str, agent_id: str) -> dict[str, str]:
        gpu = gpus.get(uuid)
        host = hosts.get(agent_id)
        return {
            "host": agent_id,
            "provider": host.provider if host else "",
            "region": host.region if host else "",
            "tier": gpu.tier if gpu else "",
            "model": gpu.model if gpu else "",
        }

    def when(ts: float) -> dict[str, str]:
        return {period: _period_label(ts, period)} if period else {}

    spans = _rented_spans(inputs.rentals, until=end)
    # telemetry: available, idle, utilization
    first_minute, last_minute = math.ceil(start / 60), math.ceil(end / 60)
    for rollup in inputs.rollups:
        if not first_minute <= rollup.minute < last_minute:
            continue
        t = rollup.minute * 60.0
        holder = _holder(spans, rollup.gpu_uuid, t)
        values = gpu_values(rollup.gpu_uuid, rollup.agent_id) | when(t)
        if holder is not None:
            values |= {"renter": holder.renter, "workload": holder.workload}
        figures = rows[key(**values)]
        figures.gpu_minutes_available += 1
        figures.gpu_minutes_idle += holder is None
        figures.utilization_sum += rollup.utilization_avg
    # uptime: the minutes each registered GPU could have reported
    if "renter" in by or "workload" in by:
        for figures in rows.values():
            figures.uptime_known = False
    else:
        for gpu in inputs.gpus:
            host = hosts.get(gpu.agent_id)
            since = max(first_minute, math.ceil((host.enrolled_at if host else 0.0) / 60))
            if since >= last_minute:
                continue
            for a, b in _pieces(since * 60.0, last_minute * 60.0, period):
                rows[key(**gpu_values(gpu.uuid, gpu.agent_id), **when(a))].gpu_minutes_expected += round((b - a) / 60)
    # rentals: GPU-hours sold, started, ended, SLA breaches
    rentals = {r.id: r for r in inputs.rentals}
    for rental in inputs.rentals:
        run_start, run_end = max(rental.started_at, start), min(rental.ended_at if rental.ended_at is not None else end, end)
        who = {"renter": rental.account, "workload": rental.workload_id}
        for placed in rental.hosts:
            held = list(placed.units[: placed.gpus]) + [""] * max(0, placed.gpus - len(placed.units))
            for unit in held:
                values = gpu_values(unit, placed.agent_id) | who
                values["provider"] = placed.provider
                for a, b in _pieces(run_start, run_end, period):
                    rows[key(**values, **when(a))].gpu_seconds_sold += b - a
            values = _common(gpu_values(u, placed.agent_id) for u in held) | who
            values["provider"] = placed.provider
            if start <= rental.started_at < end:
                rows[key(**values, **when(rental.started_at))].rentals_started += 1
            if rental.ended_at is not None and start <= rental.ended_at < end:
                ended = rows[key(**values, **when(rental.ended_at))]
                ended.rentals_ended += 1
                if rental.host_failure and _failed_through(rental, placed.agent_id):
                    ended.sla_breaches += 1
    # the ledger: gross, fees, refunds, by the entry's time
    for entry in inputs.entries:
        if entry.kind not in ("charge", "refund") or not start <= entry.ts < end:
            continue
        renter = next((ln.account.split(":", 1)[1] for ln in entry.lines if ln.account.startswith(("hold:", "renter:"))), "")
        of_rental = rentals.get(entry.rental)
        for line in entry.lines:
            if not line.host or not (line.account == FEES or line.account.startswith("provider:")):
                continue
            provider = line.account.split(":", 1)[1] if line.account.startswith("provider:") else _provider(entry, line.host)
            units = _units(of_rental, line.host)
            parts = split_amount(line.amount, len(units))
            for unit, amount in zip(units, parts, strict=True):
                values = gpu_values(unit, line.host) | {"renter": renter, "workload": line.workload} | when(entry.ts)
                values["provider"] = provider
                figures = rows[key(**values)]
                if entry.kind == "charge":
                    figures.gross += amount
                    if line.account == FEES:
                        figures.fees += amount
                elif line.account == FEES:
                    figures.fees_refunded -= amount
                else:
                    figures.refunded -= amount
    # commands that failed
    for command in inputs.commands:
        ended_at = command.finished_at if command.finished_at is not None else command.created_at
        if command.state in FAILED_COMMAND_STATES and start <= ended_at < end:
            values = gpu_values("", command.agent_id) | when(ended_at)
            rows[key(**values)].commands_failed += 1
    total = Figures()
    for figures in rows.values():
        total.add(figures)
    # A row none of whose shown figures is there (a GPU's expected minutes in a revenue report) is left out; a GPU
    # that could have reported and did not is there (its uptime is 0 %).
    columns = KINDS[kind]
    shown = [
        ReportRow(k, rows[k])
        for k in sorted(rows)
        if any(rows[k].column(c) for c in columns) or ("uptime_pct" in columns and rows[k].column("uptime_pct") is not None)
    ]
    return Report(kind=kind, by=by, start=start, end=end, columns=columns, rows=shown, total=total)


def _seen_by_provider(line: LedgerLine, own: str, hosts: Mapping[str, HostFacts]) -> bool:
    """A provider sees its own account's lines, the fees on its hosts and who paid (the renter's lines)."""
    return line.account == own or line.account.startswith(("hold:", "renter:")) or (line.account == FEES and line.host in hosts)


def _common(each: Iterable[dict[str, str]]) -> dict[str, str]:
    """The values every one of ``each`` shares; a dimension they disagree on is left out (shown as NONE)."""
    found = list(each)
    return {k: v for k, v in found[0].items() if all(other.get(k) == v for other in found[1:])} if found else {}


def _failed_through(rental: RentalRecord, agent_id: str) -> bool:
    """Whether the rental ended through host ``agent_id``: its host_failure names it ("<agent id>: why"), or names no
    host of the rental (then every host of it is held to it)."""
    named = {h.agent_id for h in rental.hosts if rental.host_failure.startswith(f"{h.agent_id}:")}
    return agent_id in named or not named


def _provider(entry: LedgerEntry, host: str) -> str:
    for line in entry.lines:
        if line.host == host and line.account.startswith("provider:"):
            return line.account.split(":", 1)[1]
    return ""


def _units(rental: RentalRecord | None, agent_id: str) -> list[str]:
    """The GPUs of ``agent_id`` a rental held, to split its money over ([""]: none known, one share)."""
    if rental is not None:
        for host in rental.hosts:
            if host.agent_id == agent_id and host.units:
                return list(host.units)
    return [""]


def iso_day(ts: float) -> str:
    """``ts`` as an ISO UTC time to the second, for messages and rendered reports."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


MAX_SPAN_S = 93 * 86400.0  # the longest window one report reads (a quarter): rollups are read GPU by GPU
DEFAULT_SPAN_S = 7 * 86400.0


def parse_instant(field_name: str, text: str) -> float:
    """A report's ``from`` or ``to``: unix seconds, an ISO date ("2026-11-23", midnight UTC) or an ISO date and time
    (UTC unless it names an offset). InvalidReport naming ``field_name`` otherwise."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidReport(
                f"{field_name}: {text!r} is neither unix seconds nor an ISO date (2026-11-23) or time (2026-11-23T10:00Z)"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        value = parsed.timestamp()
    if not math.isfinite(value) or not 0 <= value < 1e11:
        raise InvalidReport(f"{field_name}: {text!r} is not a time a report can cover")
    return value


def window(start: float | None, end: float | None, now: float) -> tuple[float, float]:
    """The window a report covers: ``to`` defaults to now, ``from`` to a week before ``to``; at most MAX_SPAN_S."""
    end = now if end is None else end
    start = end - DEFAULT_SPAN_S if start is None else start
    if not start < end:
        raise InvalidReport(f"from ({iso_day(start)}) must be before to ({iso_day(end)})")
    if end - start > MAX_SPAN_S:
        raise InvalidReport(f"from..to spans {(end - start) / 86400:.1f} days; a report covers at most {MAX_SPAN_S / 86400:g}")
    return start, end
