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
from management.views.payments import started_topup_view, topup_list_view, topup_view, webhook_receipt_view

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


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (CreateTopup, TopupQuery)


def topup_amount(text: str) -> int:
    """The micro-units of ``text``, or a 400 that says what is wrong with it (negative, not a number, too precise)."""
    if text.strip().startswith("-"):
        raise BadRequest(f"amount must be more than 0, not {text}", code="invalid_topup")
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise BadRequest(f"amount: {exc}", code="invalid_topup") from None


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


async def receive_webhook(request: web.Request) -> web.Response:
    """The provider's event, signed over these exact bytes: read raw, never re-encoded before the check."""
    if request.content_length is not None and request.content_length > MAX_WEBHOOK_BYTES:
        raise BadRequest(f"a webhook body is at most {MAX_WEBHOOK_BYTES} bytes", code="invalid_webhook")
    payload = await request.read()
    if len(payload) > MAX_WEBHOOK_BYTES:
        raise BadRequest(f"a webhook body is at most {MAX_WEBHOOK_BYTES} bytes", code="invalid_webhook")
    receipt = await request.app[SERVICES_KEY].topups.receive(payload, request.headers.get(SIGNATURE_HEADER, ""))
    return json_response(webhook_receipt_view(receipt))


__all__ = ["REQUEST_SCHEMAS"]
