"""The rules of a top-up, pure (no I/O, no clock): the amounts a renter may top up, the provider's minor units, and
what a verified provider event does (``judge``), a closed set of verdicts the service only carries out.

Invariants (tests/management/payments/test_topups.py, and the ledger's properties in tests/management/market/):
- a top-up is credited under the ledger key ``topup:<topup id>``: whatever events arrive, and however often, one
  top-up moves money once;
- only a payment the grid opened (its top-up record names the event's payment) is credited, and only in the grid's
  currency; an event for any other payment moves nothing;
- what is credited is what the provider says arrived, converted exactly from its minor units.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import IdlegridError
from management.market.money import MICRO, format_amount
from management.payments.provider import OtherEvent, PaymentEvent, TopupFailed, TopupPaid
from management.payments.records import TopupRecord

# ISO 4217 currencies whose minor unit is the unit itself, and those with three decimals, as Stripe counts them.
ZERO_DECIMAL = frozenset(
    {"BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF"}
)
THREE_DECIMAL = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})


class InvalidTopup(IdlegridError):
    """A top-up asked with an amount the grid does not take (the message says which and why)."""

    code = "invalid_topup"


class PaymentsNotConfigured(IdlegridError):
    """This grid has no payment provider set (the operator credits balances by hand)."""

    code = "payments_not_configured"


@dataclass(frozen=True)
class TopupLimits:
    """The smallest and largest top-up, in micro-units of the grid's currency (``[payments]`` in the Master's file)."""

    min_amount: int
    max_amount: int


def minor_unit(currency: str) -> int:
    """Micro-units in one minor unit of ``currency`` (a cent is 10,000)."""
    if currency.upper() in ZERO_DECIMAL:
        return MICRO
    if currency.upper() in THREE_DECIMAL:
        return MICRO // 1000
    return MICRO // 100


def to_minor(amount: int, currency: str) -> int:
    """``amount`` micro-units as the provider's minor units; InvalidTopup when it is not a whole number of them."""
    unit = minor_unit(currency)
    if amount % unit:
        raise InvalidTopup(
            f"amount {format_amount(amount)} {currency} is not a whole number of the currency's smallest unit "
            f"({format_amount(unit)}): round it"
        )
    return amount // unit


def from_minor(minor: int, currency: str) -> int:
    """The provider's ``minor`` units of ``currency`` as micro-units."""
    return minor * minor_unit(currency)


def check_topup(amount: int, currency: str, limits: TopupLimits) -> int:
    """``amount`` in minor units when the grid takes it as a top-up in ``currency``; InvalidTopup naming the bound
    it breaks otherwise (not positive, under the least, over the most, or a fraction of the smallest unit)."""
    if amount <= 0:
        raise InvalidTopup(f"amount must be more than 0, not {format_amount(amount)}")
    if amount < limits.min_amount:
        raise InvalidTopup(f"amount must be at least {format_amount(limits.min_amount)} {currency}, not {format_amount(amount)}")
    if amount > limits.max_amount:
        raise InvalidTopup(
            f"amount must be at most {format_amount(limits.max_amount)} {currency} per top-up, not {format_amount(amount)}"
        )
    return to_minor(amount, currency)


def topup_key(topup_id: str) -> str:
    """The ledger key of a top-up's credit: one per top-up, whichever event brings it."""
    return f"topup:{topup_id}"


# --- what an event does --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credit:
    """Credit ``amount`` to ``topup``'s renter under ``key``; the top-up is then credited."""

    topup: TopupRecord
    amount: int
    key: str


@dataclass(frozen=True)
class MarkFailed:
    """The top-up's payment failed: it is marked so, nothing moves."""

    topup: TopupRecord
    reason: str


@dataclass(frozen=True)
class Ignore:
    """Nothing to do (not the grid's payment, an event the grid does not act on, a top-up already settled)."""

    reason: str


@dataclass(frozen=True)
class Refuse:
    """A verified event that names the grid's payment but cannot be credited as it is (another currency, another
    payment): nothing moves, and the operator is told (a log line and an event)."""

    topup: TopupRecord
    reason: str


Verdict = Credit | MarkFailed | Ignore | Refuse


def judge(event: PaymentEvent, topup: TopupRecord | None, currency: str) -> Verdict:
    """What ``event`` (verified) does, given the top-up it names (None: no such top-up) and the grid's currency."""
    match event:
        case OtherEvent(kind=kind):
            return Ignore(f"{kind} events are not acted on")
        case TopupPaid() | TopupFailed() if topup is None:
            return Ignore(f"payment {event.reference} is not a top-up of this grid")
        case TopupPaid() | TopupFailed() if topup is not None and topup.reference != event.reference:
            return Refuse(topup, f"the event's payment {event.reference} is not top-up {topup.id}'s ({topup.reference})")
        case TopupPaid(amount=amount, currency=paid_in) if topup is not None:
            if paid_in.upper() != currency.upper():
                return Refuse(topup, f"paid in {paid_in.upper()}, but this grid's balances are in {currency}")
            if amount <= 0:
                return Refuse(topup, f"the provider says {format_amount(amount)} arrived")
            return Credit(topup, amount, topup_key(topup.id))
        case TopupFailed(reason=reason) if topup is not None:
            if topup.state != "pending":
                return Ignore(f"top-up {topup.id} is already {topup.state}")
            return MarkFailed(topup, reason)
    return Ignore("nothing to do")  # unreachable: every event kind is matched above
