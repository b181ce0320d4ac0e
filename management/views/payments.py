"""Money in and out as the API answers it: a top-up (and, once, where to pay it), a page of top-ups, what a webhook
did; a provider's payout account, its payouts, a reconciliation."""

from __future__ import annotations

from typing import Literal

from management.market.money import format_amount
from management.payments.caps import CapReading
from management.payments.payouts import Difference
from management.payments.records import BillingRecord, PayoutAccountRecord, PayoutRecord, SpendCap, TopupRecord
from management.services.payouts import Reconciliation
from management.services.topups import StartedTopup, WebhookReceipt
from management.views.base import Money, Time, View, rfc3339


class TopupView(View):
    id: str
    account: str
    amount: Money
    currency: str
    provider: str
    reference: str  # the provider's payment id
    state: Literal["pending", "credited", "failed"]
    credited: Money
    created_at: Time | None
    settled_at: Time | None
    reason: str | None  # why its payment failed
    auto: bool  # charged by the auto top-up to the saved payment method


class StartedTopupView(View):
    """POST /api/v1/billing/topups: the top-up, and the provider's hosted step the renter pays on (shown only here)."""

    topup: TopupView
    client_secret: str | None  # for the provider's own payment element (Stripe.js), never a card number
    url: str | None  # a hosted page to send the renter to, when the provider gives one


class TopupList(View):
    items: list[TopupView]


class WebhookReceiptView(View):
    """POST /api/v1/billing/webhook: what the verified event did (``replayed``: it had been acted on already)."""

    event: str
    kind: str
    outcome: Literal["credited", "failed", "ignored", "refused"]
    topup: str | None
    replayed: bool


def topup_view(rec: TopupRecord) -> TopupView:
    return TopupView(
        id=rec.id,
        account=rec.account,
        amount=format_amount(rec.amount),
        currency=rec.currency,
        provider=rec.provider,
        reference=rec.reference,
        state=rec.state,
        credited=format_amount(rec.credited),
        created_at=rfc3339(rec.created_at),
        settled_at=rfc3339(rec.settled_at),
        reason=rec.reason or None,
        auto=rec.auto,
    )


def started_topup_view(started: StartedTopup) -> StartedTopupView:
    return StartedTopupView(topup=topup_view(started.topup), client_secret=started.client_secret or None, url=started.url or None)


def topup_list_view(records: list[TopupRecord]) -> TopupList:
    return TopupList(items=[topup_view(r) for r in records])


def webhook_receipt_view(receipt: WebhookReceipt) -> WebhookReceiptView:
    return WebhookReceiptView(
        event=receipt.event_id,
        kind=receipt.kind,
        outcome=receipt.outcome,
        topup=receipt.topup_id or None,
        replayed=receipt.replayed,
    )


class PaymentMethodView(View):
    label: str  # as the provider describes it ("visa ending 4242"); never a card number


class AutoTopupView(View):
    enabled: bool
    threshold: Money  # a charge is made when the balance left falls below this
    amount: Money  # what each auto top-up charges


class SpendCapView(View):
    scope: Literal["account", "project"]
    project: str | None
    window: Literal["hour", "month"]  # the last hour (rolling), or this UTC calendar month
    limit: Money
    hard: bool  # hard: no new work, running work stopped (grace, checkpoint); soft: an alert
    spent: Money | None  # spent in the window as last read (None before the first reading)
    reached: bool


class BillingSettingsView(View):
    """A renter's billing settings: its saved payment method, auto top-up and spend caps."""

    account: str
    currency: str
    payment_method: PaymentMethodView | None
    auto_topup: AutoTopupView | None
    last_auto_topup_at: Time | None
    caps: list[SpendCapView]


def spend_cap_view(cap: SpendCap, reading: CapReading | None) -> SpendCapView:
    return SpendCapView(
        scope=cap.scope,
        project=cap.project or None,
        window=cap.window,
        limit=format_amount(cap.limit),
        hard=cap.hard,
        spent=format_amount(reading.spent) if reading is not None else None,
        reached=reading is not None and reading.reached,
    )


def billing_settings_view(rec: BillingRecord, currency: str, readings: list[CapReading] | None = None) -> BillingSettingsView:
    auto = rec.auto_topup
    return BillingSettingsView(
        account=rec.id,
        currency=currency,
        payment_method=PaymentMethodView(label=rec.payment_method_label or "saved") if rec.payment_method else None,
        auto_topup=(
            AutoTopupView(enabled=auto.enabled, threshold=format_amount(auto.threshold), amount=format_amount(auto.amount))
            if auto is not None
            else None
        ),
        last_auto_topup_at=rfc3339(rec.last_auto_topup_at),
        caps=[spend_cap_view(c, _reading(c, readings or [])) for c in rec.caps],
    )


def _reading(cap: SpendCap, readings: list[CapReading]) -> CapReading | None:
    return next((r for r in readings if r.cap == cap), None)


class PayoutAccountView(View):
    """A provider's payout account: the payment provider's connected account, whether it can take transfers yet, and
    what the provider may be paid now (its matured earnings)."""

    account: str
    provider: str  # the payment provider ("stripe")
    reference: str  # the connected account's id on it
    details_submitted: bool  # the owner finished the payment provider's onboarding
    payouts_enabled: bool  # transfers to it are possible
    payable: Money  # matured earnings: the balance less what was earned within the dispute window
    currency: str
    onboarding_url: str | None  # where the owner finishes onboarding on the payment provider (only when connecting)
    onboarding_expires_at: Time | None


class PayoutView(View):
    id: str  # the payout key: payout:<account>:<period>
    account: str
    period: str
    amount: Money
    currency: str
    destination: str
    state: Literal["pending", "transferred", "paid"]
    transfer: str | None  # the payment provider's transfer id
    created_at: Time | None
    paid_at: Time | None


class PayoutList(View):
    items: list[PayoutView]


class DifferenceView(View):
    kind: Literal["missing_transfer", "missing_entry", "amount", "unknown_transfer"]
    key: str | None  # the payout key (None: a transfer the grid did not make)
    ledger: Money
    provider: Money
    reference: str | None  # the payment provider's transfer(s)


class ReconciliationView(View):
    """What one reconciliation of the ledger's payouts with the payment provider's transfers found."""

    at: Time | None
    since: Time | None
    payouts: int
    transfers: int
    differences: list[DifferenceView]


def payout_account_view(
    rec: PayoutAccountRecord, payable: int, currency: str, url: str = "", expires_at: float | None = None
) -> PayoutAccountView:
    return PayoutAccountView(
        account=rec.id,
        provider=rec.provider,
        reference=rec.reference,
        details_submitted=rec.details_submitted,
        payouts_enabled=rec.payouts_enabled,
        payable=format_amount(payable),
        currency=currency,
        onboarding_url=url or None,
        onboarding_expires_at=rfc3339(expires_at),
    )


def payout_view(rec: PayoutRecord) -> PayoutView:
    return PayoutView(
        id=rec.id,
        account=rec.account,
        period=rec.period,
        amount=format_amount(rec.amount),
        currency=rec.currency,
        destination=rec.destination,
        state=rec.state,
        transfer=rec.transfer or None,
        created_at=rfc3339(rec.created_at),
        paid_at=rfc3339(rec.paid_at),
    )


def payout_list_view(records: list[PayoutRecord]) -> PayoutList:
    return PayoutList(items=[payout_view(r) for r in records])


def _difference_view(d: Difference) -> DifferenceView:
    return DifferenceView(
        kind=d.kind,
        key=d.key or None,
        ledger=format_amount(d.ledger),
        provider=format_amount(d.provider),
        reference=d.reference or None,
    )


def reconciliation_view(report: Reconciliation) -> ReconciliationView:
    return ReconciliationView(
        at=rfc3339(report.at),
        since=rfc3339(report.since),
        payouts=report.payouts,
        transfers=report.transfers,
        differences=[_difference_view(d) for d in report.differences],
    )
