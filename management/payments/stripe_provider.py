"""The payment provider on Stripe, through its official SDK (``stripe``): a top-up is a PaymentIntent the renter
confirms on Stripe's own payment element with its client secret (card data goes to Stripe, never to the grid), and
the grid learns of the payment from Stripe's signed webhook, checked by ``stripe.Webhook.construct_event``.

Every call opens its own HTTP connection (the SDK's aiohttp client) and closes it: top-ups are asked by people, rarely,
and the adapter then holds nothing to close. ``api_base`` points the SDK elsewhere than api.stripe.com (the tests'
localstripe). The API key and the webhook secret are never logged nor put in an error's message.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec
import stripe

from management.payments.provider import (
    BrowserStep,
    CardSetup,
    InvalidPaymentMethod,
    InvalidWebhook,
    OnboardingLink,
    OtherEvent,
    PaymentDeclined,
    PaymentEvent,
    PaymentProviderError,
    PayoutAccountStatus,
    SavedMethod,
    TopupFailed,
    TopupPaid,
    TopupRequest,
    TopupStart,
    TransferRecord,
    TransferRequest,
)
from management.payments.topups import from_minor, to_minor

NAME = "stripe"
TOPUP_METADATA = "idlegrid_topup"  # the grid's top-up id, written on the PaymentIntent
ACCOUNT_METADATA = "idlegrid_account"
STRIPE_JS = "https://js.stripe.com/v3/"
STRIPE_API = "https://api.stripe.com"
# Stripe.js draws its card element in iframes of its own origin, and a card's 3D Secure step in one of hooks.stripe.com
# (Stripe's published CSP for Stripe.js); a stand-in script served elsewhere (localstripe's) draws no frame.
STRIPE_FRAMES = ("https://js.stripe.com", "https://hooks.stripe.com")
PAYOUT_METADATA = "idlegrid_payout"  # the grid's payout key, written on a transfer (also its transfer group)
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
    def __init__(
        self,
        api_key: str,
        webhook_secret: str,
        *,
        api_base: str = "",
        tolerance_s: int = 300,
        publishable_key: str = "",
        js_url: str = STRIPE_JS,
    ) -> None:
        self._api_key = api_key
        self._webhook_secret = webhook_secret
        self._api_base = api_base
        self._tolerance_s = tolerance_s
        self._publishable_key = publishable_key
        self._js_url = js_url or STRIPE_JS

    @property
    def browser_step(self) -> BrowserStep | None:
        if not self._publishable_key:
            return None
        script = _origin(self._js_url)
        return BrowserStep(
            script_url=self._js_url,
            publishable_key=self._publishable_key,
            script_origins=(script,),
            frame_origins=STRIPE_FRAMES if script == _origin(STRIPE_JS) else (),
            connect_origins=(_origin(self._api_base) if self._api_base else STRIPE_API,),
        )

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

    async def save_method(self, account: str, customer: str, payment_method: str) -> SavedMethod:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            customer = customer or await self._customer(client, account)
            attached = await client.v1.payment_methods.attach_async(payment_method, params={"customer": customer})
            await client.v1.customers.update_async(customer, params={"invoice_settings": {"default_payment_method": attached.id}})
        except stripe.CardError as exc:
            raise PaymentDeclined(f"Stripe declined the payment method: {_said(exc)}") from None
        except stripe.InvalidRequestError as exc:
            raise InvalidPaymentMethod(f"Stripe does not take the payment method {payment_method!r}: {_said(exc)}") from None
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the payment method: {_said(exc)}") from None
        finally:
            await http.close_async()
        return SavedMethod(customer=customer, payment_method=attached.id, label=_label(attached))

    async def charge_saved(self, request: TopupRequest, method: SavedMethod, *, on_session: bool = False) -> TopupStart:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        params: stripe.params.PaymentIntentCreateParams = {
            "amount": to_minor(request.amount, request.currency),
            "currency": request.currency.lower(),
            "customer": method.customer,
            "payment_method": method.payment_method,
            "confirm": True,
            "metadata": {TOPUP_METADATA: request.topup_id, ACCOUNT_METADATA: request.account},
        }
        if not on_session:
            params["off_session"] = True
        try:
            intent = await client.v1.payment_intents.create_async(params=params, options={"idempotency_key": request.topup_id})
        except stripe.CardError as exc:
            reference = await _declined_payment(client, exc)
            raise PaymentDeclined(f"Stripe declined the charge: {_said(exc)}", reference=reference) from None
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the charge: {_said(exc)}") from None
        finally:
            await http.close_async()
        # On session, a card that asks its holder to authenticate: Stripe.js finishes the payment with this secret.
        action = on_session and intent.status == "requires_action"
        return TopupStart(reference=intent.id, client_secret=(intent.client_secret or "") if action else "")

    async def start_card_setup(self, account: str, customer: str) -> CardSetup:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            customer = customer or await self._customer(client, account)
            setup = await client.v1.setup_intents.create_async(
                params={"customer": customer, "usage": "off_session", "metadata": {ACCOUNT_METADATA: account}}
            )
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused to save a card: {_said(exc)}") from None
        finally:
            await http.close_async()
        return CardSetup(customer=customer, reference=setup.id, client_secret=setup.client_secret or "")

    async def finish_card_setup(self, account: str, customer: str, reference: str) -> SavedMethod:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            setup = await client.v1.setup_intents.retrieve_async(reference)
            owner = setup.metadata.to_dict().get(ACCOUNT_METADATA) if setup.metadata is not None else None
            if owner != account or setup.customer != customer:
                raise InvalidPaymentMethod(f"the card setup {reference!r} is not this account's")
            if setup.status != "succeeded" or not setup.payment_method:
                raise InvalidPaymentMethod(f"the card setup {reference!r} did not succeed (Stripe says {setup.status!r})")
            method_id = setup.payment_method if isinstance(setup.payment_method, str) else setup.payment_method.id
            method = await client.v1.payment_methods.retrieve_async(method_id)
            if method.customer is None:  # Stripe attaches it when the setup names the customer; localstripe does not
                method = await client.v1.payment_methods.attach_async(method_id, params={"customer": customer})
            await client.v1.customers.update_async(customer, params={"invoice_settings": {"default_payment_method": method.id}})
        except stripe.InvalidRequestError as exc:
            raise InvalidPaymentMethod(f"Stripe knows no card setup {reference!r} of this account: {_said(exc)}") from None
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused to save the card: {_said(exc)}") from None
        finally:
            await http.close_async()
        return SavedMethod(customer=customer, payment_method=method.id, label=_label(method))

    @staticmethod
    async def _customer(client: stripe.StripeClient, account: str) -> str:
        """A new customer on Stripe for ``account`` (one per account: the idempotency key)."""
        made = await client.v1.customers.create_async(
            params={"metadata": {ACCOUNT_METADATA: account}}, options={"idempotency_key": f"customer-{account}"}
        )
        return made.id

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

    # --- money out: Connect ------------------------------------------------------------------------------------------

    async def create_payout_account(self, account: str) -> PayoutAccountStatus:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            made = await client.v1.accounts.create_async(
                params={
                    "type": "express",
                    "capabilities": {"transfers": {"requested": True}},
                    "metadata": {ACCOUNT_METADATA: account},
                },
                options={"idempotency_key": f"payout-account-{account}"},
            )
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the payout account: {_said(exc)}") from None
        finally:
            await http.close_async()
        return _account_status(made)

    async def onboarding_link(self, reference: str, *, return_url: str, refresh_url: str) -> OnboardingLink:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            link = await client.v1.account_links.create_async(
                params={"account": reference, "type": "account_onboarding", "return_url": return_url, "refresh_url": refresh_url}
            )
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the onboarding link: {_said(exc)}") from None
        finally:
            await http.close_async()
        return OnboardingLink(url=link.url, expires_at=float(link.expires_at))

    async def payout_account(self, reference: str) -> PayoutAccountStatus:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            found = await client.v1.accounts.retrieve_async(reference)
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe's payout account could not be read: {_said(exc)}") from None
        finally:
            await http.close_async()
        return _account_status(found)

    async def transfer(self, request: TransferRequest) -> TransferRecord:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        try:
            # Stripe forgets an idempotency key after 24 hours: a transfer made under the key is looked for first (its
            # group is the key), so a rerun days after a crash finds it instead of paying again.
            page = await client.v1.transfers.list_async(params={"transfer_group": request.key, "limit": 10})
            made = next((t for t in page.data if _payout_key(t) == request.key), None)
            if made is None:
                made = await client.v1.transfers.create_async(
                    params={
                        "amount": to_minor(request.amount, request.currency),
                        "currency": request.currency.lower(),
                        "destination": request.destination,
                        "transfer_group": request.key,
                        "metadata": {PAYOUT_METADATA: request.key, ACCOUNT_METADATA: request.account},
                    },
                    options={"idempotency_key": request.key},
                )
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe refused the transfer: {_said(exc)}") from None
        finally:
            await http.close_async()
        return _transfer_record(made)

    async def transfers_since(self, since: float) -> list[TransferRecord]:
        http = stripe.AIOHTTPClient(timeout=30)
        client = self._client(http)
        found: list[TransferRecord] = []
        try:
            after: str | None = None
            while True:
                params: stripe.params.TransferListParams = {"created": {"gte": int(since)}, "limit": 100}
                if after is not None:
                    params["starting_after"] = after
                page = await client.v1.transfers.list_async(params=params)
                found += [_transfer_record(t) for t in page.data]
                if not page.has_more or not page.data:
                    break
                after = page.data[-1].id
        except stripe.StripeError as exc:
            raise PaymentProviderError(f"Stripe's transfers could not be read: {_said(exc)}") from None
        finally:
            await http.close_async()
        return sorted(found, key=lambda t: (t.created, t.reference))

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


async def _declined_payment(client: stripe.StripeClient, exc: stripe.CardError) -> str:
    """The PaymentIntent a declined off-session charge made: Stripe names it in the error; a server that names only
    the charge (localstripe) is asked for the charge's intent. "" when neither says."""
    error = exc.error
    intent = getattr(error, "payment_intent", None) if error is not None else None
    if intent is not None and getattr(intent, "id", None):
        return str(intent.id)
    charge_id = getattr(error, "charge", None) if error is not None else None
    if not charge_id:
        return ""
    try:
        charge = await client.v1.charges.retrieve_async(str(charge_id))
    except stripe.StripeError:
        return ""
    found = charge.payment_intent
    return found if isinstance(found, str) else (found.id if found is not None else "")


def _account_status(account: stripe.Account) -> PayoutAccountStatus:
    return PayoutAccountStatus(
        reference=account.id,
        details_submitted=bool(account.details_submitted),
        payouts_enabled=bool(account.payouts_enabled),
    )


def _payout_key(transfer: stripe.Transfer) -> str:
    metadata = transfer.metadata.to_dict() if transfer.metadata is not None else {}
    return str(metadata.get(PAYOUT_METADATA) or "")


def _transfer_record(transfer: stripe.Transfer) -> TransferRecord:
    destination = transfer.destination
    return TransferRecord(
        reference=transfer.id,
        key=_payout_key(transfer),
        destination=destination if isinstance(destination, str) else (destination.id if destination is not None else ""),
        amount=from_minor(transfer.amount, transfer.currency),
        currency=transfer.currency.upper(),
        created=float(transfer.created),
    )


def _label(method: stripe.PaymentMethod) -> str:
    """How a saved card is shown ("visa ending 4242"): the brand and last four digits Stripe gives, nothing more."""
    card = method.to_dict().get("card") or {}
    brand, last4 = card.get("brand") or "card", card.get("last4") or ""
    return f"{brand} ending {last4}" if last4 else str(brand)


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, as a Content-Security-Policy source."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _said(exc: stripe.StripeError) -> str:
    """What Stripe said, without anything of the request (its key never appears in the SDK's messages)."""
    message = exc.user_message or str(exc) or type(exc).__name__
    return message[:300]
