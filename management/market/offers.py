"""Offers: one per host with free healthy GPUs to rent, held in an in-memory index and searched with the query
language (management/market/query.py).

An offer is derived, never stored: from the host's AgentRecord and GpuRecords, which of its units are held, its price
in force (HostPrice) and its reputation. ``OfferIndex`` keeps one per host and is told of each host that changed
(``update_host`` / ``remove_host``); management/market/offer_feed.py keeps it current for a running Master.

Ranking (``score``, the default sort, descending): ``reliability ** 4 / (price + 0.10)`` with the price in currency
units per GPU-hour. The fourth power makes reputation count (a 0.9 host scores 66 % of a 1.0 host at the same
price, a 0.5 host 6 %); the 0.10 floor keeps a free host finite (it ranks like a host at a tenth of a unit per hour
less than its neighbours, not infinitely above a reliable paid one).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import operator
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import msgspec

from common.errors import BadQuery
from management.market.money import MICRO
from management.market.prices import HostPrice
from management.market.query import (
    DEFAULT_SORT,
    FIELDS,
    Condition,
    Kind,
    Query,
    SortKey,
    Value,
    parse_query,
    parse_sort,
    parse_version,
)
from management.scheduler.model import Unit
from management.scheduler.snapshot import units_of
from master.port import AgentRecord, AgentState, GpuRecord, measured_rate, measured_verified

SCORE_RELIABILITY_POWER = 4
SCORE_PRICE_FLOOR = 0.10  # currency units per GPU-hour added to every price in the score
DEFAULT_LIMIT = 50
MAX_CACHED_SORTS = 8
MAX_LIMIT = 1000
_OFFERED_STATES = frozenset({AgentState.READY.value, AgentState.BUSY.value})


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """What one host offers now. Money is in micro-units per GPU-hour (``offer_view`` in management/views/market.py
    writes decimal strings)."""

    id: str  # the host's agent id
    host: str  # its hostname, as it reports it
    provider: str
    region: str
    model: str  # of its free units (the most common model, on a host with more than one)
    # Who made that model's cards (common.inventory.GPU_VENDORS): what software stack (CUDA, ROCm) a renter's image needs.
    vendor: str = "nvidia"
    num_gpus: int  # free healthy units now
    num_gpus_on_demand: int  # what an on-demand or reserved rental can have: the free units and those interruptible rentals hold
    total_gpus: int  # every unit it has, held and faulty included
    gpu_ram: float  # GiB, of its smallest free unit
    tier: str  # of the free units of ``model`` ("" when not tiered)
    compute_capability: str  # "9.0"
    cuda: str  # the CUDA version its driver supports, "" when not reported
    price: int  # on demand, micro-units per GPU-hour
    min_bid: int | None  # None: not rented interruptible
    reserved_price: int
    max_duration_s: float | None  # None: no limit
    reliability: float  # the host's reputation score, 0..1
    inet_down: float | None  # Mbps, None when not measured
    inet_up: float | None
    cpu_cores: float  # per GPU: the host's cores / its GPUs
    ram_gib: float  # per GPU
    disk_gib: float | None  # free disk per GPU, None when not reported
    verified: bool  # every free unit's GPU is verified by measurement (master/verification.py): never a simulated one
    interruptible: bool  # takes interruptible rentals (a min bid is set)
    runtime: str  # "docker" | "podman" | "process" ...
    nvlink: bool  # at least two of its free units are NVLinked to each other
    score: float  # the ranking (module docstring)
    images: list[str] = []  # the images the host already has, warm first: a container of one of them starts at once
    # Measured by the GPUs' latest passed verification runs (the slowest shown unit's): None until every one has run.
    tflops: float | None = None  # dense FP16/BF16 tensor TFLOP/s
    memory_bandwidth_gbs: float | None = None
    tflops_per_price: float | None = None  # TFLOP/s per currency unit per GPU-hour, on demand
    # The share of its rentals in the window that did not end through it (docs/disputes.md); None: too few rentals.
    completion_rate: float | None = None


class EmptiedBy(msgspec.Struct, frozen=True, kw_only=True):
    """The condition after which nothing matched, and how many offers matched before it."""

    condition: str
    position: int
    matched_before: int
    sentence: str  # for a person: "no offer has price<1 (2 matched the conditions before it)"


class SearchResult(msgspec.Struct, frozen=True, kw_only=True):
    offers: list[Offer]
    next_cursor: str | None  # None: this was the last page
    total: int  # offers that match the query, across every page
    sort: str  # the sort applied, e.g. "-score"
    emptied_by: EmptiedBy | None = None  # set when nothing matched and some condition is to blame


class OfferChoices(msgspec.Struct, frozen=True, kw_only=True):
    """The values offered now, for a search form's menus: each list sorted, without repeats or empty values."""

    models: list[str]
    tiers: list[str]
    regions: list[str]


def offer_choices(offers: Iterable[Offer]) -> OfferChoices:
    """The models, tiers and regions of ``offers``."""
    models: set[str] = set()
    tiers: set[str] = set()
    regions: set[str] = set()
    for offer in offers:
        models.add(offer.model)
        tiers.add(offer.tier)
        regions.add(offer.region)
    return OfferChoices(models=sorted(models - {""}), tiers=sorted(tiers - {""}), regions=sorted(regions - {""}))


def score_of(reliability: float, price_micro: int) -> float:
    return round(reliability**SCORE_RELIABILITY_POWER / (price_micro / MICRO + SCORE_PRICE_FLOOR), 6)


def offer_of(
    agent: AgentRecord,
    gpus: Sequence[GpuRecord],
    held: Collection[str],
    price: HostPrice,
    reliability: float,
    *,
    allow_sandboxed: bool = False,
    outbid: Collection[str] = (),
    completion_rate: float | None = None,
) -> Offer | None:
    """The offer of one host, or None when it offers nothing: not ready/busy, drained, not isolating a renter's work
    in a container (or in the process runtime's sandbox, when the operator allows it: ``allow_sandboxed``, as
    master/allocations.py ``offered`` decides), or no free healthy unit.
    ``held``: the uuids of its GPUs and MIG instances that a container holds (a GPU held whole takes its instances);
    ``outbid``: those of them an interruptible rental holds, which an on-demand or reserved rental may have by preempting
    it (a host they fill still offers them, on demand)."""
    if agent.state not in _OFFERED_STATES or agent.drained:
        return None
    if not (agent.isolation == "container" or (allow_sandboxed and agent.isolation == "sandbox")):
        return None
    units = units_of(gpus)
    free = [u for u in units if u.healthy and u.id not in held and (u.parent is None or u.parent not in held)]
    preemptible = [u for u in units if u.healthy and (u.id in outbid or (u.parent is not None and u.parent in outbid))]
    shown = free or preemptible  # what the offer describes: its free units, else those it offers on demand only
    if not shown:
        return None
    by_uuid = {g.uuid: g for g in gpus}
    model = Counter(u.model for u in shown).most_common(1)[0][0]
    of_model = [u for u in shown if u.model == model]
    first = of_model[0]
    gpu = by_uuid.get(first.parent or first.id)
    tflops, bandwidth = _measured(shown, by_uuid)
    info = agent.host
    total = len(units)
    cuda = next((g.info.cuda_version for g in gpus if g.info.cuda_version), "")
    disk = info.disk_free_gib / total if info is not None and info.disk_total_gib > 0 else None
    return Offer(
        id=agent.id,
        host=info.hostname if info is not None else agent.id,
        provider=agent.provider,
        region=agent.region,
        model=model,
        vendor=gpu.info.vendor if gpu is not None else "nvidia",
        num_gpus=len(free),
        num_gpus_on_demand=len(free) + len(preemptible),
        total_gpus=total,
        gpu_ram=round(min(u.vram_mib for u in shown) / 1024, 2),
        tier=first.tier or "",
        compute_capability=gpu.info.compute_capability if gpu is not None else "",
        cuda=cuda,
        price=price.on_demand,
        min_bid=price.min_bid,
        reserved_price=price.reserved,
        max_duration_s=price.max_duration_s,
        reliability=round(reliability, 4),
        inet_down=info.bandwidth_mbps_down if info is not None else None,
        inet_up=info.bandwidth_mbps_up if info is not None else None,
        cpu_cores=round(info.cpu_cores / total, 2) if info is not None else 0.0,
        ram_gib=round(info.ram_mib / 1024 / total, 2) if info is not None else 0.0,
        disk_gib=round(disk, 1) if disk is not None else None,
        verified=_verified(shown, by_uuid),
        interruptible=price.min_bid is not None,
        runtime=agent.runtime or "docker",
        images=list(agent.images),
        nvlink=_nvlinked(shown),
        score=score_of(reliability, price.on_demand),
        tflops=tflops,
        memory_bandwidth_gbs=bandwidth,
        tflops_per_price=round(tflops / (price.on_demand / MICRO), 2) if tflops is not None and price.on_demand > 0 else None,
        completion_rate=completion_rate,
    )


def _verified(free: Sequence[Unit], by_uuid: dict[str, GpuRecord]) -> bool:
    gpus = [by_uuid.get(u.parent or u.id) for u in free]
    return all(g is not None and measured_verified(g) for g in gpus)


def _measured(shown: Sequence[Unit], by_uuid: dict[str, GpuRecord]) -> tuple[float | None, float | None]:
    """The slowest shown unit's measured (tensor TFLOP/s, memory GB/s); None where a unit has no passed run. A MIG
    instance shows its whole GPU's figures (it gets a share of them)."""
    rates = [measured_rate(g) if (g := by_uuid.get(u.parent or u.id)) is not None else (None, None) for u in shown]
    tensor = [t for t, _ in rates]
    memory = [m for _, m in rates]
    return (
        min(tensor) if tensor and None not in tensor else None,  # type: ignore[type-var]
        min(memory) if memory and None not in memory else None,  # type: ignore[type-var]
    )


def _nvlinked(free: Sequence[Unit]) -> bool:
    ids = {u.id for u in free}
    return any(u.nvlink_peers & ids for u in free)


# --- the index ---------------------------------------------------------------------------------------------------

NO_LIMIT = 1e300  # max_duration_s of a host with no limit, as queries compare it (finite: cursors carry it as JSON)
# An offer's values as queries compare them (numbers, text, version tuples, None: not reported), in FIELDS' order and
# read by a field's position (_FIELD_AT): each field's kind is FIELDS', known only at run time, so the row is open. A
# tuple rather than a dict by name: the index holds one per host, and a dict of 31 entries was about 1.2 KB of the
# Master's memory per host (bench/HISTORY.md, "The Master's memory per agent").
OfferValues = tuple[Any, ...]
_FIELD_AT = {name: at for at, name in enumerate(FIELDS)}


class _Row:
    """An offer with its values as queries compare them: versions as tuples, no limit as infinity."""

    __slots__ = ("offer", "values")

    def __init__(self, offer: Offer) -> None:
        self.offer = offer
        self.values: OfferValues = tuple(_compared(offer, name, kind) for name, kind in FIELDS.items())


def _compared(offer: Offer, name: str, kind: Kind) -> Any:
    """``offer``'s value of field ``name`` as queries compare it."""
    value = getattr(offer, name)
    if kind is Kind.VERSION:
        return _version_or_none(value)
    if name == "max_duration_s" and value is None:
        return NO_LIMIT
    return value


def _version_or_none(text: str) -> tuple[int, ...] | None:
    try:
        return parse_version(text) if text else None
    except ValueError:
        return None


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _predicate(condition: Condition) -> Callable[[OfferValues], bool]:
    """A test on a row's values. A missing value (None: not reported) matches no condition but ``!=`` / ``notin``."""
    at, op, value = _FIELD_AT[condition.field], condition.op, condition.value
    if op in ("in", "notin"):
        assert isinstance(value, tuple)
        members = frozenset(value)
        if op == "in":
            return lambda v: v[at] in members
        return lambda v: v[at] not in members
    compare = _COMPARE[op]
    if op == "!=":
        return lambda v: v[at] != value
    if op == "=":
        return lambda v: v[at] == value
    return lambda v: (x := v[at]) is not None and compare(x, value)


def _sort_key(field: str, kind: Kind, descending: bool) -> Callable[[_Row], tuple[Any, ...]]:
    """Rows sort ascending by this key, whatever the direction: missing values last, then the id (a stable order a
    cursor can resume from)."""

    at = _FIELD_AT[field]

    def key(row: _Row) -> tuple[Any, ...]:
        value = row.values[at]
        if value is None:
            return (1, 0, row.offer.id)
        if descending:
            value = _negated(value, kind)
        return (0, value, row.offer.id)

    return key


def _negated(value: Any, kind: Kind) -> Any:
    if kind is Kind.WORD:
        return (*(-ord(c) for c in value), 1)  # the sentinel: a longer word with the same start sorts first
    if kind is Kind.VERSION:
        return (*(-part for part in value), 1)
    return -value


class OfferIndex:
    """One offer per host, kept current by whoever knows a host changed; searched by query, sorted, paged."""

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        # sort ("-score") -> its key and every row in that order: kept in step with each change (a removal and an
        # insertion each), so a search never sorts the whole index again; at most MAX_CACHED_SORTS sorts, latest used.
        self._order: dict[str, tuple[Callable[[_Row], tuple[Any, ...]], list[tuple[tuple[Any, ...], _Row]]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, host_id: object) -> bool:
        return host_id in self._rows

    def get(self, host_id: str) -> Offer | None:
        row = self._rows.get(host_id)
        return row.offer if row is not None else None

    def offers(self) -> list[Offer]:
        return [row.offer for row in self._rows.values()]

    def put(self, offer: Offer) -> None:
        """Hold ``offer`` as its host's offer (replacing the one before)."""
        old = self._rows.get(offer.id)
        if old is not None and old.offer == offer:
            return
        row = _Row(offer)
        self._rows[offer.id] = row
        for key, ordered in self._order.values():
            if old is not None:
                _take_out(ordered, key(old), old)
            pair = (key(row), row)
            ordered.insert(bisect.bisect_left(ordered, pair[0], key=_first), pair)

    def update_host(
        self,
        agent: AgentRecord,
        gpus: Sequence[GpuRecord],
        held: Collection[str],
        price: HostPrice,
        reliability: float,
        *,
        allow_sandboxed: bool = False,
        outbid: Collection[str] = (),
        completion_rate: float | None = None,
    ) -> Offer | None:
        """Re-derive one host's offer from plain inputs (``offer_of``); the host leaves the index when it offers
        nothing. Returns the offer now held, or None."""
        offer = offer_of(
            agent, gpus, held, price, reliability, allow_sandboxed=allow_sandboxed, outbid=outbid, completion_rate=completion_rate
        )
        if offer is None:
            self.remove_host(agent.id)
        else:
            self.put(offer)
        return offer

    def remove_host(self, host_id: str) -> None:
        old = self._rows.pop(host_id, None)
        if old is not None:
            for key, ordered in self._order.values():
                _take_out(ordered, key(old), old)

    def search(
        self,
        query: Query | str = "",
        sort: SortKey | str | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> SearchResult:
        """The offers matching ``query``, sorted by ``sort`` (the query's own ``sort=`` wins; default: score,
        descending), ``limit`` from ``cursor`` on (the ``next_cursor`` of the page before). BadQuery for a query,
        sort, limit or cursor that is not one."""
        parsed = parse_query(query) if isinstance(query, str) else query
        order = parsed.sort or (parse_sort(sort) if isinstance(sort, str) else sort) or DEFAULT_SORT
        if not 1 <= limit <= MAX_LIMIT:
            raise BadQuery(f"limit must be between 1 and {MAX_LIMIT}, not {limit}", token=str(limit))
        after = _decode_cursor(cursor, order) if cursor else None
        rows = list(self._rows.values())
        emptied_by = None
        for condition in parsed.conditions:
            test = _predicate(condition)
            kept = [row for row in rows if test(row.values)]
            if not kept and rows:
                before = (
                    f"{len(rows)} matched the conditions before it"
                    if condition is not parsed.conditions[0]
                    else f"it is the first condition; {len(rows)} offer{'s' if len(rows) != 1 else ''} in all"
                )
                emptied_by = EmptiedBy(
                    condition=condition.text,
                    position=condition.position,
                    matched_before=len(rows),
                    sentence=f"no offer has {condition.text} ({before})",
                )
            rows = kept
            if not rows:
                break
        ordered = self._ordered(order, rows, whole=not parsed.conditions)
        try:
            start = bisect.bisect_right(ordered, after, key=_first) if after is not None else 0
        except TypeError:
            raise BadQuery(f"cursor {cursor!r} is not a cursor from a previous page of this search", token=cursor or "") from None
        page = ordered[start : start + limit]
        more = start + limit < len(ordered)
        next_cursor = _encode_cursor(order, page[-1][0]) if more and page else None
        return SearchResult(
            offers=[row.offer for _, row in page],
            next_cursor=next_cursor,
            total=len(rows),
            sort=str(order),
            emptied_by=emptied_by,
        )

    def _ordered(self, order: SortKey, rows: list[_Row], *, whole: bool) -> list[tuple[tuple[Any, ...], _Row]]:
        """``rows`` with their sort keys, in order: taken from the index's kept order of that sort (made on first use),
        or, for a filtered set under a quarter of the index with no kept order, sorted on its own."""
        name = str(order)
        cached = self._order.pop(name, None)
        if cached is None:
            key = _sort_key(order.field, FIELDS[order.field], order.descending)
            if not whole and len(rows) * 4 < len(self._rows):
                return sorted(((key(row), row) for row in rows), key=_first)
            cached = (key, sorted(((key(row), row) for row in self._rows.values()), key=_first))
            while len(self._order) >= MAX_CACHED_SORTS:
                del self._order[next(iter(self._order))]
        self._order[name] = cached  # the latest used last
        everything = cached[1]
        if whole:
            return everything
        wanted = {id(row) for row in rows}
        return [pair for pair in everything if id(pair[1]) in wanted]


def _first(pair: tuple[tuple[Any, ...], _Row]) -> tuple[Any, ...]:
    return pair[0]


def _take_out(ordered: list[tuple[tuple[Any, ...], _Row]], key: tuple[Any, ...], row: _Row) -> None:
    at = bisect.bisect_left(ordered, key, key=_first)
    if at < len(ordered) and ordered[at][1] is row:
        del ordered[at]
    else:  # not where its key says (cannot happen while keys are pure): find it the slow way
        ordered[:] = [pair for pair in ordered if pair[1] is not row]


def _encode_cursor(order: SortKey, key: tuple[Any, ...]) -> str:
    raw = msgspec.json.encode([str(order), key])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, order: SortKey) -> tuple[Any, ...]:
    """The sort key a page ended at; BadQuery for a cursor that is not one of ours or was made for another sort."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        made_for, key = msgspec.json.decode(raw, type=tuple[str, list[Any]])
    except (binascii.Error, msgspec.DecodeError, ValueError):
        raise BadQuery(f"cursor {cursor[:40]!r} is not a cursor from a previous page of this search", token=cursor) from None
    if len(key) != 3 or key[0] not in (0, 1) or not isinstance(key[2], str):  # (missing, value, id): _sort_key
        raise BadQuery(f"cursor {cursor[:40]!r} is not a cursor from a previous page of this search", token=cursor)
    if made_for != str(order):
        raise BadQuery(
            f"cursor was made for sort={made_for}, and this search sorts by {order}: start again without a cursor",
            token=cursor,
        )
    return tuple(_tuples(v) for v in key)


def _tuples(value: Value | list[Any]) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
