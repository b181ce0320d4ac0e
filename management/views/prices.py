"""Providers' and hosts' prices (management/api/resources/prices.py). Money goes out as decimal strings per
GPU-hour ("2.50"), with the currency; never a float."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from management.market.money import format_amount
from management.market.prices import HostPrice
from management.views.base import Money, StructFields, Time, View, rfc3339
from master.port import (
    PriceRecord,
)


class PriceTermsView(View):
    on_demand: Money
    min_bid: Money | None  # null: not rented interruptible
    reserved_discount: float
    reserved: Money
    max_duration_s: float | None


class PriceRecordView(PriceTermsView):
    provider: str
    agent_id: str | None  # null: the provider's default
    scope: Literal["host", "provider"]
    currency: str
    updated_at: Time | None


class HostPriceView(PriceTermsView):
    agent_id: str
    provider: str
    source: str  # the host's own, its provider's default, or the grid's
    currency: str


class PriceListing(View):
    currency: str
    grid_default: PriceTermsView
    items: list[PriceRecordView]


def _price_terms(price: HostPrice) -> StructFields:
    return {
        "on_demand": format_amount(price.on_demand),
        "min_bid": format_amount(price.min_bid) if price.min_bid is not None else None,  # null: not interruptible
        "reserved_discount": price.reserved_discount,
        "reserved": format_amount(price.reserved),
        "max_duration_s": price.max_duration_s,
    }


def price_record_view(record: PriceRecord, currency: str) -> PriceRecordView:
    """One provider's price record: its default (``agent_id`` null) or one host's own."""
    terms = HostPrice(
        on_demand=record.on_demand,
        min_bid=record.min_bid,
        reserved_discount=record.reserved_discount,
        max_duration_s=record.max_duration_s,
    )
    return PriceRecordView(
        provider=record.provider,
        agent_id=record.agent_id or None,
        scope="host" if record.agent_id else "provider",
        currency=currency,
        updated_at=rfc3339(record.updated_at),
        **_price_terms(terms),
    )


def host_price_view(agent_id: str, provider: str, price: HostPrice, currency: str) -> HostPriceView:
    """The price in force on a host and its ``source``: the host's own, its provider's default, or the grid's."""
    return HostPriceView(agent_id=agent_id, provider=provider, source=price.source, currency=currency, **_price_terms(price))


def price_listing_view(records: Sequence[PriceRecord], grid_default: HostPrice, currency: str) -> PriceListing:
    return PriceListing(
        currency=currency,
        grid_default=PriceTermsView(**_price_terms(grid_default)),
        items=[price_record_view(r, currency) for r in records],
    )
