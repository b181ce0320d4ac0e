"""The payment provider as the grid sees it: create a top-up (the renter pays on the provider's hosted step, so no card
data ever reaches the grid), and turn a signed webhook delivery into a typed, verified event.

An adapter (``StripeProvider``) implements ``PaymentProvider``; the composition root picks it from the Master's
settings (management/settings.py ``PaymentSettings``), and nothing else in the grid names the provider's SDK.
Amounts cross this interface in the grid's micro-units (management/market/money.py); the adapter converts to and from
the provider's minor units (management/payments/topups.py ``to_minor``/``from_minor``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from common.errors import IdlegridError


class PaymentProviderError(IdlegridError):
    """The provider refused a request or could not be reached (the message says which, never a secret)."""

    code = "payment_provider_error"


class InvalidWebhook(IdlegridError):
    """A webhook delivery whose signature does not verify with the endpoint's secret, is too old, or is not an event
    the provider sends: nothing of it is believed."""

    code = "invalid_webhook"


class TopupRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the grid asks the provider to collect: ``amount`` micro-units of ``currency`` for renter ``account``,
    under the grid's top-up id (also the provider's idempotency key: asking twice makes one payment)."""

    topup_id: str
    account: str
    amount: int
    currency: str


class TopupStart(msgspec.Struct, frozen=True, kw_only=True):
    """Where the renter pays: the provider's ``reference`` of the payment (a PaymentIntent id), and its hosted step,
    a ``client_secret`` for the provider's own payment page or element, or a ``url`` to send the renter to."""

    reference: str
    client_secret: str = ""
    url: str = ""


class TopupPaid(msgspec.Struct, frozen=True, kw_only=True):
    """The provider collected a top-up: ``amount`` micro-units of ``currency`` arrived for payment ``reference``."""

    event_id: str
    kind: str  # the provider's event type ("payment_intent.succeeded")
    reference: str
    topup_id: str  # the grid's id, as the grid wrote it on the payment ("" when the payment is not the grid's)
    amount: int
    currency: str


class TopupFailed(msgspec.Struct, frozen=True, kw_only=True):
    """A top-up's payment failed (a declined card); ``reason`` is the provider's message."""

    event_id: str
    kind: str
    reference: str
    topup_id: str
    reason: str


class OtherEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A verified event the grid does not act on (yet): recorded, answered 200, nothing moved."""

    event_id: str
    kind: str


PaymentEvent = TopupPaid | TopupFailed | OtherEvent


class PaymentProvider(Protocol):
    """A payment provider's adapter."""

    @property
    def name(self) -> str:
        """The provider's name in records and answers ("stripe")."""

    async def create_topup(self, request: TopupRequest) -> TopupStart:
        """Open a payment for ``request`` on the provider; PaymentProviderError when it refuses or is unreachable."""

    def verify_event(self, payload: bytes, signature: str) -> PaymentEvent:
        """The event of one webhook delivery, checked against the endpoint's secret over the raw ``payload``;
        InvalidWebhook when the signature, its age or the payload is wrong."""

    async def events_since(self, since: float) -> list[PaymentEvent]:
        """The top-up events the provider made at or after unix time ``since``, read from its API (authenticated by
        the grid's key, so believed without a signature), oldest first: what webhooks missed during an outage.
        PaymentProviderError when it refuses or is unreachable."""

    async def close(self) -> None:
        """Release the adapter's connections."""
