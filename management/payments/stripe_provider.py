"""The payment provider on Stripe, through its official SDK (``stripe``): a top-up is a PaymentIntent the renter
confirms on Stripe's own payment element with its client secret (card data goes to Stripe, never to the grid), and
the grid learns of the payment from Stripe's signed webhook, checked by ``stripe.Webhook.construct_event``.

Every call opens its own HTTP connection (the SDK's aiohttp client) and closes it: top-ups are asked by people, rarely,
and the adapter then holds nothing to close. ``api_base`` points the SDK elsewhere than api.stripe.com (the tests'
localstripe). The API key and the webhook secret are never logged nor put in an error's message.
"""

from __future__ import annotations

import msgspec
import stripe

from management.payments.provider import (
    InvalidWebhook,
    OtherEvent,
    PaymentEvent,
    PaymentProviderError,
    TopupFailed,
    TopupPaid,
    TopupRequest,
    TopupStart,
)
from management.payments.topups import from_minor, to_minor

NAME = "stripe"
TOPUP_METADATA = "idlegrid_topup"  # the grid's top-up id, written on the PaymentIntent
ACCOUNT_METADATA = "idlegrid_account"
PAID = "payment_intent.succeeded"
FAILED = "payment_intent.payment_failed"


class _Metadata(msgspec.Struct, kw_only=True):
    idlegrid_topup: str = ""


class _PaymentError(msgspec.Struct, kw_only=True):
    message: str = ""
    code: str = ""


class _PaymentIntent(msgspec.Struct, kw_only=True):
    """The fields of a PaymentIntent the grid reads (Stripe sends many more)."""

    id: str
    amount: int
    currency: str
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    amount_received: int | None = None  # localstripe leaves it out; Stripe's succeeded intents always carry it
    last_payment_error: _PaymentError | None = None


class _EventData(msgspec.Struct, kw_only=True):
    object: msgspec.Raw


class _Event(msgspec.Struct, kw_only=True):
    id: str
    type: str
    data: _EventData


class StripeProvider:
    def __init__(self, api_key: str, webhook_secret: str, *, api_base: str = "", tolerance_s: int = 300) -> None:
        self._api_key = api_key
        self._webhook_secret = webhook_secret
        self._api_base = api_base
        self._tolerance_s = tolerance_s

    @property
    def name(self) -> str:
        return NAME

    def __repr__(self) -> str:
        return f"StripeProvider(api_base={self._api_base or stripe.DEFAULT_API_BASE!r})"  # never the key or the secret

    async def create_topup(self, request: TopupRequest) -> TopupStart:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            intent = await client.v1.payment_intents.create_async(
                params={
                    "amount": to_minor(request.amount, request.currency),
                    "currency": request.currency.lower(),
                    "metadata": {TOPUP_METADATA: request.topup_id, ACCOUNT_METADATA: request.account},
                },
                options={"idempotency_key": request.topup_id},
            )
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the top-up: {_said(exc)}") from None
        finally:
            await http.close_async()
        return TopupStart(reference=intent.id, client_secret=intent.client_secret or "")

    def verify_event(self, payload: bytes, signature: str) -> PaymentEvent:
        if not signature:
            raise InvalidWebhook("no Stripe-Signature header: a webhook delivery is believed only when signed")
        try:
            checked = stripe.Webhook.construct_event(payload, signature, self._webhook_secret, tolerance=self._tolerance_s)
        except stripe.SignatureVerificationError:
            raise InvalidWebhook("the Stripe-Signature does not verify with this endpoint's secret (or is too old)") from None
        except ValueError:
            raise InvalidWebhook("the payload is not JSON") from None
        try:
            event = msgspec.json.decode(payload, type=_Event)
        except msgspec.ValidationError as exc:
            raise InvalidWebhook(f"the payload is not a Stripe event: {exc}") from None
        if event.id != checked.id:  # the SDK read the same bytes: a mismatch would be a bug, never believed
            raise InvalidWebhook("the event could not be read consistently")
        if event.type not in (PAID, FAILED):
            return OtherEvent(event_id=event.id, kind=event.type)
        try:
            intent = msgspec.json.decode(event.data.object, type=_PaymentIntent)
        except msgspec.ValidationError as exc:
            raise InvalidWebhook(f"the event's payment intent is malformed: {exc}") from None
        return _typed(event.id, event.type, intent)

    async def events_since(self, since: float) -> list[PaymentEvent]:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        found: list[tuple[int, PaymentEvent]] = []
        try:
            for kind in (PAID, FAILED):
                after: str | None = None
                while True:
                    params: stripe.params.EventListParams = {"type": kind, "created": {"gte": int(since)}, "limit": 100}
                    if after is not None:
                        params["starting_after"] = after
                    page = await client.v1.events.list_async(params=params)
                    for listed in page.data:
                        found.append((listed.created, self._listed(listed)))
                    if not page.has_more or not page.data:
                        break
                    after = page.data[-1].id
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe's events could not be read: {_said(exc)}") from None
        finally:
            await http.close_async()
        return [event for _, event in sorted(found, key=lambda pair: pair[0])]

    @staticmethod
    def _listed(listed: stripe.Event) -> PaymentEvent:
        try:
            intent = msgspec.convert(listed.data.object.to_dict(), _PaymentIntent)
        except msgspec.ValidationError as exc:
            raise PaymentProviderError(f"Stripe listed event {listed.id} with a malformed payment intent: {exc}") from None
        return _typed(listed.id, listed.type, intent)

    def _client(self, http: stripe.AIOHTTPClient) -> stripe.StripeClient:
        return stripe.StripeClient(
            self._api_key,
            base_addresses={"api": self._api_base} if self._api_base else None,
            http_client=http,
            max_network_retries=2,
        )

    async def close(self) -> None:
        return None  # every call closed its own connection


def _typed(event_id: str, kind: str, intent: _PaymentIntent) -> PaymentEvent:
    """A payment intent's event as the grid's typed event."""
    topup_id = intent.metadata.idlegrid_topup
    if kind == PAID:
        received = intent.amount if intent.amount_received is None else intent.amount_received
        return TopupPaid(
            event_id=event_id,
            kind=kind,
            reference=intent.id,
            topup_id=topup_id,
            amount=from_minor(received, intent.currency),
            currency=intent.currency.upper(),
        )
    error = intent.last_payment_error
    reason = (error.message or error.code) if error is not None else ""
    return TopupFailed(
        event_id=event_id, kind=kind, reference=intent.id, topup_id=topup_id, reason=reason or "the payment failed"
    )


def _said(exc: stripe.StripeError) -> str:
    """What Stripe said, without anything of the request (its key never appears in the SDK's messages)."""
    message = exc.user_message or str(exc) or type(exc).__name__
    return message[:300]
