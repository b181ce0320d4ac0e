"""Money in as the API answers it: a top-up (and, once, where to pay it), a page of top-ups, what a webhook did."""

from __future__ import annotations

from typing import Literal

from management.market.money import format_amount
from management.payments.records import TopupRecord
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
