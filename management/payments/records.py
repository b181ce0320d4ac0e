"""What the store keeps of money coming in (management/store/payments.py): each top-up a renter started, and each
provider event the grid acted on (its id, so a replayed delivery is recognised after any restart)."""

from __future__ import annotations

import secrets
from typing import Literal

import msgspec

TopupState = Literal["pending", "credited", "failed"]
EventOutcome = Literal["credited", "failed", "ignored", "refused"]


class TopupRecord(msgspec.Struct, kw_only=True):
    """One top-up: ``amount`` micro-units of ``currency`` asked for renter ``account`` through ``provider``, whose
    payment is ``reference``. ``pending`` until the provider's signed event says it was paid (``credited``: ``credited``
    micro-units under ledger key ``ledger_key``) or that it failed (``reason``)."""

    id: str  # "tu-" + random hex; also the provider's idempotency key and the payment's metadata
    account: str
    amount: int
    currency: str
    provider: str
    reference: str  # the provider's payment id (a Stripe PaymentIntent id)
    created_at: float
    state: TopupState = "pending"
    credited: int = 0
    ledger_key: str = ""
    event_id: str = ""  # the provider's event that settled it
    settled_at: float | None = None
    reason: str = ""


class PaymentEventRecord(msgspec.Struct, kw_only=True):
    """One provider event the grid verified and acted on, by ``id`` (``<provider>:<event id>``): stored after its
    effect, so a delivery seen again is answered from here and moves nothing."""

    id: str
    provider: str
    event_id: str
    kind: str  # the provider's event type
    received_at: float
    outcome: EventOutcome
    topup_id: str = ""
    detail: str = ""


def new_topup_id() -> str:
    return "tu-" + secrets.token_hex(8)


def event_key(provider: str, event_id: str) -> str:
    """The store's key of a provider's event: event ids are unique per provider only."""
    return f"{provider}:{event_id}"
