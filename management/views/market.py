"""The market's answers: offers, balances, ledger entries and statements, spend, earnings and payouts, rentals.
Money as decimal strings in the grid's currency ("2.50"), exact to the micro-unit.
An offer (management/market/offers.py) is its struct with the money written out: ``OfferView`` states the same fields
in the same order, and tests/management/test_api_responses.py reads offers through the API and decodes them as it."""

from __future__ import annotations

import msgspec

from management.market.completion import CompletionRate
from management.market.ledger import Statement
from management.market.money import format_amount
from management.market.offers import Offer, SearchResult
from management.services.market import FundsDetail, RentalDetail, Statements
from management.views.base import Money, Time, View, page_of, rfc3339
from master.port import (
    LedgerEntry,
)


class OfferView(View):
    id: str
    host: str
    provider: str
    region: str
    model: str
    vendor: str  # nvidia | amd | ...: the software stack (CUDA, ROCm) the host's cards run
    num_gpus: int
    num_gpus_on_demand: int
    total_gpus: int
    gpu_ram: float
    tier: str
    compute_capability: str
    cuda: str
    price: Money
    min_bid: Money | None
    reserved_price: Money
    max_duration_s: float | None
    reliability: float
    inet_down: float | None
    inet_up: float | None
    cpu_cores: float
    ram_gib: float
    disk_gib: float | None
    verified: bool
    interruptible: bool
    runtime: str
    nvlink: bool
    score: float
    images: list[str]  # the images the host already has, warm first
    tflops: float | None  # measured dense tensor TFLOP/s (a passed verification run), None until measured
    memory_bandwidth_gbs: float | None
    tflops_per_price: float | None  # TFLOP/s per currency unit per GPU-hour
    completion_rate: float | None  # rentals in the window not ended through the host (docs/disputes.md); None: too few


class EmptiedByView(View):
    condition: str
    position: int
    matched_before: int
    sentence: str


class OfferSearch(View):
    offers: list[OfferView]
    next_cursor: str | None
    total: int
    sort: str
    emptied_by: EmptiedByView | None


class FundsView(View):
    account: str
    currency: str
    available: Money
    held: Money
    unbilled: Money
    running_per_hour: Money
    covers_s: float | None
    warning: str | None


class LedgerLineView(View):
    account: str
    amount: Money
    host: str | None
    workload: str | None


class LedgerEntryView(View):
    seq: int
    key: str
    ts: Time | None
    kind: str
    memo: str
    rental: str | None
    lines: list[LedgerLineView]


class Credited(View):
    """POST /api/v1/accounts/{id}/credit: the entry written and the balance after it."""

    entry: LedgerEntryView
    balance: FundsView


class StatementLineView(View):
    seq: int
    ts: Time | None
    key: str
    kind: str
    memo: str
    rental: str | None
    workload: str | None
    amount: Money
    balance: Money


class StatementView(View):
    accounts: list[str]
    currency: str
    period: str | None  # the UTC day, ISO week or month asked for (None: every entry)
    after_seq: int
    opening: Money
    closing: Money
    lines: list[StatementLineView]
    next_after: int
    more: bool


class WorkloadSpendView(View):
    workload: str
    charged: Money
    refunded: Money
    net: Money


class HostEarningsView(View):
    agent_id: str
    gross: Money
    fee: Money
    refunded: Money
    net: Money


class PeriodEarningsView(View):
    label: str
    start: Time | None
    end: Time | None
    gross: Money
    fee: Money
    refunded: Money
    net: Money


class SpendStatements(View):
    account: str
    currency: str
    items: list[WorkloadSpendView]


class EarningsStatements(View):
    account: str
    currency: str
    items: list[HostEarningsView]


class PayoutStatements(View):
    account: str
    currency: str
    items: list[PeriodEarningsView]


class RentalHostView(View):
    agent_id: str
    provider: str
    gpus: int
    price: Money


class BidChangeView(View):
    at: Time | None
    price: Money


class RentalView(View):
    """A rental; ``account`` and ``workload`` are the renter's, absent from a provider's view."""

    id: str
    kind: str
    currency: str
    hosts: list[RentalHostView]
    bid_changes: list[BidChangeView]
    gpus: int
    started_at: Time | None
    ended_at: Time | None
    end_reason: str | None
    host_failure: str | None
    reserved_until: Time | None
    rating: int | None
    charged: Money
    account: str | msgspec.UnsetType = msgspec.UNSET
    workload: str | msgspec.UnsetType = msgspec.UNSET


RentalPage = page_of(RentalView)


def offer_view(offer: Offer) -> OfferView:
    """The offer as the API shows it: money as decimal strings in currency units."""
    fields = msgspec.structs.asdict(offer)
    fields["price"] = format_amount(offer.price)
    fields["reserved_price"] = format_amount(offer.reserved_price)
    fields["min_bid"] = format_amount(offer.min_bid) if offer.min_bid is not None else None
    return OfferView(**fields)


def search_view(result: SearchResult) -> OfferSearch:
    """A search's answer as the API shows it: each offer through ``offer_view``."""
    emptied = result.emptied_by
    return OfferSearch(
        offers=[offer_view(o) for o in result.offers],
        next_cursor=result.next_cursor,
        total=result.total,
        sort=result.sort,
        emptied_by=EmptiedByView(**msgspec.structs.asdict(emptied)) if emptied is not None else None,
    )


def funds_view(funds: FundsDetail) -> FundsView:
    covers = funds.covers_s
    return FundsView(
        account=funds.account,
        currency=funds.currency,
        available=format_amount(funds.available),
        held=format_amount(funds.held),
        unbilled=format_amount(funds.unbilled),
        running_per_hour=format_amount(funds.running_per_hour),
        covers_s=round(covers, 1) if covers is not None else None,
        warning=funds.warning or None,
    )


def ledger_entry_view(entry: LedgerEntry) -> LedgerEntryView:
    return LedgerEntryView(
        seq=entry.seq,
        key=entry.key,
        ts=rfc3339(entry.ts),
        kind=entry.kind,
        memo=entry.memo,
        rental=entry.rental or None,
        lines=[
            LedgerLineView(
                account=line.account,
                amount=format_amount(line.amount),
                host=line.host or None,
                workload=line.workload or None,
            )
            for line in entry.lines
        ],
    )


def credited_view(entry: LedgerEntry, funds: FundsDetail) -> Credited:
    """A credit: the entry written and the balance after it."""
    return Credited(entry=ledger_entry_view(entry), balance=funds_view(funds))


def statement_view(statement: Statement, currency: str) -> StatementView:
    """A ledger statement: each entry's effect on the account's ledger accounts, with the balance after it."""
    return StatementView(
        accounts=statement.accounts,
        currency=currency,
        period=statement.period or None,
        after_seq=statement.after_seq,
        opening=format_amount(statement.opening),
        closing=format_amount(statement.closing),
        lines=[
            StatementLineView(
                seq=line.seq,
                ts=rfc3339(line.ts),
                key=line.key,
                kind=line.kind,
                memo=line.memo,
                rental=line.rental or None,
                workload=line.workload or None,
                amount=format_amount(line.amount),
                balance=format_amount(line.balance),
            )
            for line in statement.lines
        ],
        next_after=statement.next_after,
        more=statement.more,
    )


def spend_view(statements: Statements) -> SpendStatements:
    """A renter's spend per workload (``Statements`` of WorkloadSpend), every amount as a decimal string."""
    items = [
        WorkloadSpendView(
            workload=item.workload,
            charged=format_amount(item.charged),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return SpendStatements(account=statements.account, currency=statements.currency, items=items)


def earnings_view(statements: Statements) -> EarningsStatements:
    """A provider's earnings per host (``Statements`` of HostEarnings)."""
    items = [
        HostEarningsView(
            agent_id=item.agent_id,
            gross=format_amount(item.gross),
            fee=format_amount(item.fee),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return EarningsStatements(account=statements.account, currency=statements.currency, items=items)


def payouts_view(statements: Statements) -> PayoutStatements:
    """A provider's earnings per period (``Statements`` of PeriodEarnings), the period's bounds as RFC 3339."""
    items = [
        PeriodEarningsView(
            label=item.label,
            start=rfc3339(item.start),
            end=rfc3339(item.end),
            gross=format_amount(item.gross),
            fee=format_amount(item.fee),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return PayoutStatements(account=statements.account, currency=statements.currency, items=items)


def rental_view(detail: RentalDetail, *, for_provider: bool) -> RentalView:
    """A rental; a provider sees its hosts' rentals without the renter or its workload (they are the renter's)."""
    r = detail.rental
    view = RentalView(
        id=r.id,
        kind=r.kind,
        currency=detail.currency,
        hosts=[
            RentalHostView(agent_id=h.agent_id, provider=h.provider, gpus=h.gpus, price=format_amount(h.price)) for h in r.hosts
        ],
        bid_changes=[BidChangeView(at=rfc3339(c.at), price=format_amount(c.price)) for c in r.bid_changes],
        gpus=r.gpus,
        started_at=rfc3339(r.started_at),
        ended_at=rfc3339(r.ended_at),
        end_reason=r.end_reason or None,
        host_failure=r.host_failure or None,
        reserved_until=rfc3339(r.reserved_until),
        rating=r.rating,
        charged=format_amount(detail.charged),
    )
    if not for_provider:
        view.account = r.account
        view.workload = r.workload_id
    return view


class CompletionView(View):
    """A host's rental completion rate over the window by close reason (docs/disputes.md, "Completion rates")."""

    agent_id: str
    rentals: int  # rentals that ended in the window since its last review
    by_reason: dict[str, int]  # completed, cancelled, failed, requeued, host_failure, other_host
    rate: float | None  # the share not ended through the host; None with too few rentals
    under_review: bool  # below the grid's threshold: not offered until an operator reviews it
    reviewed_at: Time | None


def completion_view(rate: CompletionRate) -> CompletionView:
    return CompletionView(
        agent_id=rate.agent_id,
        rentals=rate.rentals,
        by_reason=dict(rate.by_reason),
        rate=rate.rate,
        under_review=rate.under_review,
        reviewed_at=rfc3339(rate.reviewed_at),
    )
