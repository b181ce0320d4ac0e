"""Prices in force: a host's own, else its provider's default, else the grid's default (MasterConfig).

``HostPrice`` and ``PriceTable`` are pure. ``PriceBook`` is the one writer of providers' prices: it validates a
``PriceSetting``, stores the record (``price_repo(store)``), keeps the table in memory (``price`` never reads the store:
the scheduler and the offer index call it for every host) and tells its listeners which price changed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

import msgspec

from common.errors import InvalidPrice, NotFound
from management.market.money import BadAmount, parse_amount
from management.store.prices import PriceRepo
from master.port import MasterConfig, PriceRecord

log = logging.getLogger(__name__)

MAX_RESERVED_DISCOUNT = 0.9
MIN_MAX_DURATION_S = 3600.0  # a host that caps rentals takes at least an hour
PPM = 1_000_000  # a discount is applied in millionths, the precision of a micro-unit amount


def reserved_price(on_demand: int, discount: float) -> int:
    """``on_demand`` less ``discount`` (a fraction in [0, 0.9]), rounded down, by integer arithmetic on the discount's
    decimal digits (to a millionth): never a float product, never above ``on_demand``."""
    off_ppm = int((Decimal(repr(discount)) * PPM).to_integral_value(rounding=ROUND_HALF_EVEN))
    off_ppm = min(max(off_ppm, 0), PPM)
    return on_demand * (PPM - off_ppm) // PPM


@dataclass(frozen=True, slots=True)
class HostPrice:
    """What one host charges, in micro-units per GPU-hour, and where that came from."""

    on_demand: int
    min_bid: int | None = None  # None: not rented interruptible
    reserved_discount: float = 0.0
    max_duration_s: float | None = None
    source: str = "grid"  # "host" | "provider" | "grid"

    @property
    def reserved(self) -> int:
        """The reserved price per GPU-hour: the discount off on-demand, rounded down, in integers (a float product
        lost a micro-unit: 0.867400 at 30% off gave 0.607179), never above on demand."""
        return reserved_price(self.on_demand, self.reserved_discount)


class PriceTable:
    """Every provider's price records, resolved per host: ``price(provider, agent_id)``."""

    def __init__(self, records: Iterable[PriceRecord], grid_default: HostPrice) -> None:
        self.grid_default = grid_default
        self._records: dict[tuple[str, str], PriceRecord] = {(r.provider, r.agent_id): r for r in records}

    def put(self, rec: PriceRecord) -> None:
        self._records[(rec.provider, rec.agent_id)] = rec

    def remove(self, provider: str, agent_id: str) -> None:
        self._records.pop((provider, agent_id), None)

    def record(self, provider: str, agent_id: str) -> PriceRecord | None:
        return self._records.get((provider, agent_id))

    def records(self) -> list[PriceRecord]:
        return list(self._records.values())

    def price(self, provider: str, agent_id: str) -> HostPrice:
        rec = self._records.get((provider, agent_id))
        source = "host"
        if rec is None:
            rec, source = self._records.get((provider, "")), "provider"
        if rec is None:
            return self.grid_default
        return HostPrice(
            on_demand=rec.on_demand,
            min_bid=rec.min_bid,
            reserved_discount=rec.reserved_discount,
            max_duration_s=rec.max_duration_s,
            source=source,
        )


# --- the book: validated writes, kept in memory, listeners told ------------------------------------------------------


class PriceSetting(msgspec.Struct, kw_only=True, frozen=True):
    """What a provider asks, for one host or as its default; amounts as decimal strings per GPU-hour ("2.50")."""

    on_demand: str
    min_bid: str | None = None  # None: not rented interruptible
    reserved_discount: float = 0.0  # in [0, 0.9]
    max_duration_s: float | None = None  # >= 3600, None: no limit


PriceListener = Callable[[str, str | None], None]  # (provider, agent id, or None when the provider's default changed)


def _amount(field: str, text: str) -> int:
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise InvalidPrice(f"{field}: {exc}") from None


def price_record(provider: str, agent_id: str, setting: PriceSetting, now: float) -> PriceRecord:
    """``setting`` checked and turned into the record to store; InvalidPrice names the field that is wrong."""
    on_demand = _amount("on_demand", setting.on_demand)
    min_bid = None if setting.min_bid is None else _amount("min_bid", setting.min_bid)
    discount = setting.reserved_discount
    if not (math.isfinite(discount) and 0.0 <= discount <= MAX_RESERVED_DISCOUNT):
        raise InvalidPrice(f"reserved_discount: {discount} is not a fraction from 0 to {MAX_RESERVED_DISCOUNT} (0.2 is 20% off)")
    longest = setting.max_duration_s
    if longest is not None and not (math.isfinite(longest) and longest >= MIN_MAX_DURATION_S):
        raise InvalidPrice(
            f"max_duration_s: {longest} is shorter than an hour; give at least {MIN_MAX_DURATION_S:.0f} seconds, or none"
        )
    return PriceRecord(
        provider=provider,
        agent_id=agent_id,
        on_demand=on_demand,
        min_bid=min_bid,
        reserved_discount=discount,
        max_duration_s=longest,
        updated_at=now,
    )


def grid_default_of(config: MasterConfig) -> HostPrice:
    """The price of a host whose provider set none: ``default_price`` on demand, ``default_min_bid`` ("" for
    on demand only)."""
    min_bid = parse_amount(config.default_min_bid) if config.default_min_bid else None
    return HostPrice(on_demand=parse_amount(config.default_price), min_bid=min_bid, source="grid")


class PriceBook:
    """Every provider's prices: stored in ``repo``, resolved from memory. ``owner_of(agent_id)`` says which provider
    a host belongs to (None: no such host); with it, a provider may price only its own hosts (another's answers
    NotFound, as a missing one does)."""

    def __init__(
        self,
        repo: PriceRepo,
        grid_default: HostPrice,
        clock: Callable[[], float] = time.time,
        *,
        owner_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self._repo = repo
        self._clock = clock
        self._owner_of = owner_of
        self._table = PriceTable((), grid_default)
        self._listeners: list[PriceListener] = []
        self.loaded = False

    @property
    def grid_default(self) -> HostPrice:
        return self._table.grid_default

    async def load(self) -> None:
        """Read every record from the store (once; later calls do nothing)."""
        if self.loaded:
            return
        for rec in await self._repo.list():
            self._table.put(rec)
        self.loaded = True

    # --- reads: memory only ---

    def price(self, provider: str, agent_id: str) -> HostPrice:
        """The price in force for ``agent_id`` of ``provider``, with its source ("host" | "provider" | "grid")."""
        return self._table.price(provider, agent_id)

    def record(self, provider: str, agent_id: str = "") -> PriceRecord | None:
        """The provider's own record for the host (``agent_id`` "": its default), None when it set none."""
        return self._table.record(provider, agent_id)

    def records(self, provider: str | None = None) -> list[PriceRecord]:
        """Every record (one provider's when given), by provider, then agent id (the default, "", first)."""
        found = [r for r in self._table.records() if provider is None or r.provider == provider]
        return sorted(found, key=lambda r: (r.provider, r.agent_id))

    # --- writes: stored first, then memory, then listeners ---

    async def set_host(self, provider: str, agent_id: str, change: PriceSetting) -> PriceRecord:
        if not agent_id:
            raise InvalidPrice("agent_id: name the host to price (a provider's default is set with set_default)")
        self._check_owner(provider, agent_id)
        return await self._put(price_record(provider, agent_id, change, self._clock()))

    async def set_default(self, provider: str, change: PriceSetting) -> PriceRecord:
        if not provider:
            raise InvalidPrice("provider: name the provider whose default price this is")
        return await self._put(price_record(provider, "", change, self._clock()))

    async def clear_host(self, provider: str, agent_id: str) -> bool:
        """The host goes back to its provider's default (or the grid's); False when it had no price of its own."""
        if not agent_id:
            raise InvalidPrice("agent_id: name the host whose own price to clear")
        self._check_owner(provider, agent_id)
        return await self._remove(provider, agent_id)

    async def clear_default(self, provider: str) -> bool:
        """The provider's hosts without a price of their own go back to the grid's default."""
        return await self._remove(provider, "")

    def subscribe(self, listener: PriceListener) -> Callable[[], None]:
        """``listener(provider, agent_id)`` after every change (agent_id None: the provider's default changed, so
        every host of it without its own price did); returns the call that unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _check_owner(self, provider: str, agent_id: str) -> None:
        if self._owner_of is not None and self._owner_of(agent_id) != provider:
            raise NotFound(f"no agent {agent_id!r}")  # another provider's host: the same answer as a missing one

    async def _put(self, rec: PriceRecord) -> PriceRecord:
        await self.load()
        await self._repo.put(rec)
        self._table.put(rec)
        self._notify(rec.provider, rec.agent_id or None)
        return rec

    async def _remove(self, provider: str, agent_id: str) -> bool:
        await self.load()
        removed = await self._repo.delete(provider, agent_id)
        had = self._table.record(provider, agent_id) is not None
        self._table.remove(provider, agent_id)
        if removed or had:
            self._notify(provider, agent_id or None)
        return removed or had

    def _notify(self, provider: str, agent_id: str | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(provider, agent_id)
            except Exception:  # one broken listener must not keep the others (or the caller) from the change
                log.exception("price listener failed", extra={"provider": provider, "agent_id": agent_id})
