"""The payment provider as the grid sees it: create a top-up (the renter pays on the provider's hosted step, so no card
data ever reaches the grid), and turn a signed webhook delivery into a typed, verified event. Money out: a provider's
connected payout account (made and onboarded on the provider's own hosted pages: no bank data reaches the grid), a
transfer of matured earnings to it, and the transfers made, for the reconciliation (docs/payments.md, "Payouts").

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


class SavedMethod(msgspec.Struct, frozen=True, kw_only=True):
    """A payment method saved on the provider for off-session charges: the provider's customer and payment method ids
    (tokens: no card data), and how the provider describes it ("visa ending 4242")."""

    customer: str
    payment_method: str
    label: str = ""


class CardSetup(msgspec.Struct, frozen=True, kw_only=True):
    """A card being saved on the provider's own element in the renter's browser: the renter's ``customer`` on the
    provider (made when it had none), the setup's ``reference`` (a SetupIntent id) and its ``client_secret``, which the
    provider's script takes with the card (the card goes from the browser to the provider, never to the grid)."""

    customer: str
    reference: str
    client_secret: str


class BrowserStep(msgspec.Struct, frozen=True, kw_only=True):
    """What a console page loads to let the renter enter a card on the provider's own element: the provider's script
    (``script_url``, from the provider's origin), the grid's publishable key for it, and the origins the page's
    Content-Security-Policy must allow for it: scripts, frames (the element's iframes) and connections."""

    script_url: str
    publishable_key: str
    script_origins: tuple[str, ...]
    frame_origins: tuple[str, ...]
    connect_origins: tuple[str, ...]


class PaymentDeclined(PaymentProviderError):
    """The provider declined a charge of a saved payment method (a card refused, authentication needed);
    ``reference`` is the declined payment's id when the provider made one ("" otherwise)."""

    code = "payment_declined"

    def __init__(self, message: str, *, reference: str = "") -> None:
        super().__init__(message)
        self.reference = reference


class InvalidPaymentMethod(PaymentProviderError):
    """The provider knows no such payment method token, or will not keep it (the renter's request is wrong: a 400)."""

    code = "invalid_payment_method"


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


class PayoutAccountStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A provider's connected account as the payment provider reports it: its ``reference`` (a Stripe account id),
    whether its owner finished the provider's onboarding (``details_submitted``) and whether it can take transfers
    (``payouts_enabled``: the provider's checks passed)."""

    reference: str
    details_submitted: bool = False
    payouts_enabled: bool = False


class OnboardingLink(msgspec.Struct, frozen=True, kw_only=True):
    """Where the provider's owner goes to give its bank and identity details, on the payment provider's hosted page
    (never through the grid); ``expires_at`` in unix time."""

    url: str
    expires_at: float


class TransferRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A transfer of ``amount`` micro-units of ``currency`` to connected account ``destination``, under the grid's
    payout ``key`` (also its idempotency key and its group: asked twice, one transfer; found again by the key)."""

    key: str
    account: str  # the grid's provider account it pays
    destination: str
    amount: int
    currency: str


class TransferRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A transfer as the payment provider keeps it: its ``reference``, the grid's payout ``key`` written on it ("" for a
    transfer the grid did not make), where it went, how much (micro-units) and when (unix time)."""

    reference: str
    key: str
    destination: str
    amount: int
    currency: str
    created: float


class PaymentProvider(Protocol):
    """A payment provider's adapter."""

    @property
    def name(self) -> str:
        """The provider's name in records and answers ("stripe")."""

    async def create_topup(self, request: TopupRequest) -> TopupStart:
        """Open a payment for ``request`` on the provider; PaymentProviderError when it refuses or is unreachable."""

    async def save_method(self, account: str, customer: str, payment_method: str) -> SavedMethod:
        """Keep ``payment_method`` (a token the provider's hosted step made) for off-session charges of ``account``:
        attached to its ``customer`` on the provider (a new customer when ``""``). PaymentDeclined when the provider
        declines the method, InvalidPaymentMethod when it knows no such token, PaymentProviderError when it refuses
        otherwise or is unreachable."""

    async def charge_saved(self, request: TopupRequest, method: SavedMethod, *, on_session: bool = False) -> TopupStart:
        """Charge ``request`` to a saved method, off session (no renter present) unless ``on_session`` (the renter is
        on the console: a card that needs the renter's authentication answers a ``client_secret`` for the provider's
        script); the money is believed only from the provider's signed event, as for any top-up. PaymentDeclined when
        the charge is declined at once."""

    @property
    def browser_step(self) -> BrowserStep | None:
        """What the console loads for the provider's card element; None when the grid cannot offer it (no publishable
        key configured): renters then save cards and top up through the API or the CLI."""

    async def start_card_setup(self, account: str, customer: str) -> CardSetup:
        """Open the saving of a card for ``account`` (its ``customer`` on the provider, a new one when ``""``), to be
        completed by the provider's script in the renter's browser. PaymentProviderError when the provider refuses."""

    async def finish_card_setup(self, account: str, customer: str, reference: str) -> SavedMethod:
        """The card saved by setup ``reference``, as read from the provider's API (believed: authenticated by the
        grid's key), attached to ``customer`` and made its default. InvalidPaymentMethod when the setup is not this
        account's or did not succeed, PaymentProviderError when the provider refuses or is unreachable."""

    def verify_event(self, payload: bytes, signature: str) -> PaymentEvent:
        """The event of one webhook delivery, checked against the endpoint's secret over the raw ``payload``;
        InvalidWebhook when the signature, its age or the payload is wrong."""

    async def events_since(self, since: float) -> list[PaymentEvent]:
        """The top-up events the provider made at or after unix time ``since``, read from its API (authenticated by
        the grid's key, so believed without a signature), oldest first: what webhooks missed during an outage.
        PaymentProviderError when it refuses or is unreachable."""

    async def create_payout_account(self, account: str) -> PayoutAccountStatus:
        """Make a connected account for provider ``account`` (its idempotency key names the account: asked twice, one
        account). PaymentProviderError when the provider refuses or is unreachable."""

    async def onboarding_link(self, reference: str, *, return_url: str, refresh_url: str) -> OnboardingLink:
        """A fresh link to the provider's hosted onboarding of connected account ``reference``."""

    async def payout_account(self, reference: str) -> PayoutAccountStatus:
        """Connected account ``reference`` as the provider reports it now."""

    async def transfer(self, request: TransferRequest) -> TransferRecord:
        """Move ``request.amount`` to its destination, once per ``request.key``: a transfer the provider already made
        under that key is answered as it is (found by the key, whatever the age of the idempotency key), never made
        again. PaymentProviderError when the provider refuses or is unreachable (nothing moved, or the next call with
        the same key finds what did)."""

    async def transfers_since(self, since: float) -> list[TransferRecord]:
        """Every transfer the provider made at or after unix time ``since``, oldest first (the reconciliation's read)."""

    async def close(self) -> None:
        """Release the adapter's connections."""
