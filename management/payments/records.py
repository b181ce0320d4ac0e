"""What the store keeps of money coming in (management/store/payments.py): each top-up a renter started, and each
provider event the grid acted on (its id, so a replayed delivery is recognised after any restart)."""

from __future__ import annotations

import secrets
from typing import Final, Literal

import msgspec

TopupState = Literal["pending", "credited", "failed"]
# A top-up's failed state by name: "failed" is a workload's state too, and state comparisons go through a name
# (tests/management/workloads/test_state_names.py), so a misspelling fails the import, not the comparison.
TOPUP_FAILED: Final[TopupState] = "failed"
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
    auto: bool = False  # charged by the auto top-up to the saved payment method, not opened by the renter


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


class AutoTopup(msgspec.Struct, frozen=True, kw_only=True):
    """A renter's auto top-up: when its balance (available and held, less what ran since the last charges) falls
    below ``threshold`` micro-units, ``amount`` is charged to its saved payment method, at most once an hour."""

    enabled: bool = True
    threshold: int
    amount: int


CapScope = Literal["account", "project"]
CapWindow = Literal["hour", "month"]


class SpendCap(msgspec.Struct, frozen=True, kw_only=True):
    """A spending limit of a renter, on the whole account or one ``project``, over the last hour (rolling) or this
    UTC calendar month: ``soft`` raises an alert, ``hard`` places no new work and stops what runs (docs/payments.md)."""

    scope: CapScope = "account"
    project: str = ""  # with scope "project"
    window: CapWindow
    limit: int  # micro-units
    hard: bool = False


class BillingRecord(msgspec.Struct, kw_only=True):
    """A renter's billing settings, by account id: its saved payment method on the provider (``customer`` and
    ``payment_method``: the provider's ids, never card data), its auto top-up and its spend caps."""

    id: str  # the account
    customer: str = ""
    payment_method: str = ""
    payment_method_label: str = ""  # e.g. "visa ending 4242", as the provider describes it
    auto_topup: AutoTopup | None = None
    last_auto_topup_at: float | None = None  # when the last auto top-up was tried (charged or not)
    caps: list[SpendCap] = []
    updated_at: float = 0.0
    version: int = 1


PayoutState = Literal["pending", "transferred", "paid"]


class PayoutAccountRecord(msgspec.Struct, kw_only=True):
    """A provider's connected payout account on the payment provider, by the provider's grid account ``id``: the payment
    provider's ``reference`` (a Stripe account id; the bank and identity details stay on the payment provider), and its
    status as last read."""

    id: str  # the grid's provider account
    provider: str  # the payment provider ("stripe")
    reference: str
    details_submitted: bool = False
    payouts_enabled: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0


class PayoutRecord(msgspec.Struct, kw_only=True):
    """One payout of a provider's matured earnings for one ``period``, by its ``id``, the payout key
    (``payout:<account>:<period>``: also the ledger entry's key and the transfer's idempotency key). Stored ``pending``
    with its amount before the transfer, so a run after a crash pays the same amount under the same key; ``transferred``
    once the payment provider made the transfer (``transfer``); ``paid`` once the ledger entry is posted."""

    id: str
    account: str
    period: str
    amount: int
    currency: str
    destination: str  # the connected account's reference
    created_at: float
    state: PayoutState = "pending"
    transfer: str = ""  # the payment provider's transfer id
    transferred_at: float | None = None
    paid_at: float | None = None
