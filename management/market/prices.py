"""Prices in force: a host's own, else its provider's default, else the grid's default (MasterConfig). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from master.records import PriceRecord


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
        """The reserved price per GPU-hour (the discount off on-demand, rounded down)."""
        return int(self.on_demand * (1.0 - self.reserved_discount))


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
