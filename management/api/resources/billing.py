"""Money in (docs/payments.md): a renter's top-ups through the payment provider, and the provider's webhook.

``POST /api/v1/billing/topups`` opens a top-up and answers the provider's hosted step (a client secret for its payment
element, or a URL); the balance is credited only when the provider's signed webhook says the money arrived.
``POST /api/v1/billing/webhook`` takes no API key: the provider's signature over the raw body is its only credential,
checked before anything of the body is read.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from management.access_control import acting_account
from management.api.auth import scope_of
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import AccountName, EmptyQuery
from management.market.money import BadAmount, parse_amount
from management.payments.records import AutoTopup, BillingRecord, CapScope, CapWindow, SpendCap
from management.views.payments import (
    billing_settings_view,
    payout_account_view,
    payout_list_view,
    reconciliation_view,
    started_topup_view,
    topup_list_view,
    topup_view,
    webhook_receipt_view,
)

SIGNATURE_HEADER = "Stripe-Signature"  # the one provider's header; another provider's adapter names its own
MAX_WEBHOOK_BYTES = 256 * 1024  # a Stripe event is a few KiB; a body past this is no event of theirs

TopupAmount = Annotated[
    str, msgspec.Meta(min_length=1, max_length=32, description='a decimal amount of the grid\'s currency ("25", "25.50")')
]


class CreateTopup(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/billing/topups: how much to add to the balance, in the grid's currency; for an operator, whose."""

    amount: TopupAmount
    account: AccountName | None = None


class TopupQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    account: AccountName | None = None  # the operator's filter; a renter sees its own


# A payment method as the provider's hosted step made it (Stripe: "pm_..."): a token, never card data.
PaymentMethodToken = Annotated[str, msgspec.Meta(min_length=3, max_length=255, pattern=r"^[A-Za-z0-9_]+\Z")]


class SavePaymentMethod(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PUT /api/v1/billing/payment-method: the provider's token of the renter's payment method, kept for auto
    top-ups (it replaces one kept before)."""

    payment_method: PaymentMethodToken
    account: AccountName | None = None


class SetAutoTopup(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PUT /api/v1/billing/auto-topup: charge ``amount`` to the saved payment method whenever the balance left falls
    below ``threshold`` (at most once an hour); ``enabled`` false turns it off."""

    enabled: bool = True
    threshold: TopupAmount = "0"
    amount: TopupAmount = "0"
    account: AccountName | None = None


class CapBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scope: CapScope = "account"
    project: Annotated[str, msgspec.Meta(max_length=64)] = ""
    window: CapWindow
    limit: TopupAmount
    hard: bool = False


class SetCaps(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PUT /api/v1/billing/caps: the renter's spend caps, all of them (an empty list removes them)."""

    caps: Annotated[list[CapBody], msgspec.Meta(max_length=20)]
    account: AccountName | None = None


class BillingQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    account: AccountName | None = None  # the operator names the account; a renter reads its own


ReturnUrl = Annotated[str, msgspec.Meta(max_length=2000, pattern=r"^https?://[^\s]+\Z")]


class ConnectPayoutAccount(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/billing/payout-account: connect the provider's payout account on the payment provider (once), and
    get a link to its hosted onboarding; where the owner's browser comes back to (default: the console's statements
    page)."""

    account: AccountName | None = None
    return_url: ReturnUrl | None = None
    refresh_url: ReturnUrl | None = None


class PayoutQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    account: AccountName | None = None  # the operator names the provider (or, for the list, filters); a provider its own


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (
    CreateTopup,
    TopupQuery,
    SavePaymentMethod,
    SetAutoTopup,
    CapBody,
    SetCaps,
    BillingQuery,
    ConnectPayoutAccount,
    PayoutQuery,
)


def topup_amount(text: str, field: str = "amount") -> int:
    """The micro-units of ``text``, or a 400 that says what is wrong with it (negative, not a number, too precise)."""
    if text.strip().startswith("-"):
        raise BadRequest(f"{field} must be more than 0, not {text}", code="invalid_topup")
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise BadRequest(f"{field}: {exc}", code="invalid_topup") from None


async def create_topup(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateTopup)
    account = acting_account(scope_of(request), body.account)
    started = await request.app[SERVICES_KEY].topups.create(account, topup_amount(body.amount))
    return json_response(started_topup_view(started), status=201)


async def list_topups(request: web.Request) -> web.Response:
    query = parse_query(request, TopupQuery)
    records = await request.app[SERVICES_KEY].topups.list_topups(owner=scope_of(request).owner, account=query.account)
    return json_response(topup_list_view(records))


async def get_topup(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    record = await request.app[SERVICES_KEY].topups.get(request.match_info["topup_id"], owner=scope_of(request).owner)
    return json_response(topup_view(record))


def _settings_answer(request: web.Request, record: BillingRecord) -> web.Response:
    services = request.app[SERVICES_KEY]
    readings = services.spend_caps.readings(record.id)
    return json_response(billing_settings_view(record, services.billing_settings.currency, readings))


async def get_billing_settings(request: web.Request) -> web.Response:
    query = parse_query(request, BillingQuery)
    record = await request.app[SERVICES_KEY].billing_settings.get(acting_account(scope_of(request), query.account))
    return _settings_answer(request, record)


async def set_caps(request: web.Request) -> web.Response:
    body = await parse_body(request, SetCaps)
    account = acting_account(scope_of(request), body.account)
    caps = [
        SpendCap(scope=c.scope, project=c.project, window=c.window, limit=cap_limit(c.limit, n), hard=c.hard)
        for n, c in enumerate(body.caps, start=1)
    ]
    record = await request.app[SERVICES_KEY].billing_settings.set_caps(account, caps)
    return _settings_answer(request, record)


def cap_limit(text: str, n: int) -> int:
    """A cap's limit in micro-units, or a 400 naming the cap (negative, not a number, too precise)."""
    if text.strip().startswith("-"):
        raise BadRequest(f"cap {n}: the limit must be more than 0, not {text}", code="invalid_caps")
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise BadRequest(f"cap {n}: limit: {exc}", code="invalid_caps") from None


async def save_payment_method(request: web.Request) -> web.Response:
    body = await parse_body(request, SavePaymentMethod)
    service = request.app[SERVICES_KEY].billing_settings
    record = await service.save_method(acting_account(scope_of(request), body.account), body.payment_method)
    return _settings_answer(request, record)


async def set_auto_topup(request: web.Request) -> web.Response:
    body = await parse_body(request, SetAutoTopup)
    account = acting_account(scope_of(request), body.account)
    service = request.app[SERVICES_KEY].billing_settings
    setting = None
    if body.enabled:
        setting = AutoTopup(threshold=topup_amount(body.threshold, "threshold"), amount=topup_amount(body.amount))
    record = await service.set_auto_topup(account, setting)
    return _settings_answer(request, record)


async def receive_webhook(request: web.Request) -> web.Response:
    """The provider's event, signed over these exact bytes: read raw, never re-encoded before the check."""
    if request.content_length is not None and request.content_length > MAX_WEBHOOK_BYTES:
        raise BadRequest(f"a webhook body is at most {MAX_WEBHOOK_BYTES} bytes", code="invalid_webhook")
    payload = await request.read()
    if len(payload) > MAX_WEBHOOK_BYTES:
        raise BadRequest(f"a webhook body is at most {MAX_WEBHOOK_BYTES} bytes", code="invalid_webhook")
    receipt = await request.app[SERVICES_KEY].topups.receive(payload, request.headers.get(SIGNATURE_HEADER, ""))
    return json_response(webhook_receipt_view(receipt))


# --- money out (docs/payments.md, "Payout accounts", "Payouts", "Reconciliation") -------------------------------------


async def connect_payout_account(request: web.Request) -> web.Response:
    body = await parse_body(request, ConnectPayoutAccount)
    account = acting_account(scope_of(request), body.account)
    payouts = request.app[SERVICES_KEY].payouts
    back = f"{request.url.origin()}/console/statements"
    connected = await payouts.connect(account, return_url=body.return_url or back, refresh_url=body.refresh_url or back)
    link = connected.link
    view = payout_account_view(
        connected.account,
        await payouts.payable(account),
        payouts.currency,
        link.url if link is not None else "",
        link.expires_at if link is not None else None,
    )
    return json_response(view)


async def get_payout_account(request: web.Request) -> web.Response:
    query = parse_query(request, PayoutQuery)
    account = acting_account(scope_of(request), query.account)
    payouts = request.app[SERVICES_KEY].payouts
    record = await payouts.payout_account(account)
    return json_response(payout_account_view(record, await payouts.payable(account), payouts.currency))


async def list_payouts(request: web.Request) -> web.Response:
    query = parse_query(request, PayoutQuery)
    records = await request.app[SERVICES_KEY].payouts.list_payouts(owner=scope_of(request).owner, account=query.account)
    return json_response(payout_list_view(records))


async def run_payouts(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    return json_response(payout_list_view(await request.app[SERVICES_KEY].payouts.run()))


async def reconcile_payouts(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    return json_response(reconciliation_view(await request.app[SERVICES_KEY].payouts.reconcile()))


__all__ = ["REQUEST_SCHEMAS"]
