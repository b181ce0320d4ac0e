"""A renter's top-up on the console (docs/payments.md, "Topping up on the console"): the card is entered on the payment
provider's own element, drawn by the provider's script in the renter's browser, and goes from there to the provider
only. The page's script (static/topup.js) calls the two routes here:

1. ``POST /console/billing/topup/setup {amount}``: the amount is checked (before any card is asked for) and a card setup
   is opened on the provider; the answer is its client secret, which the provider's script takes with the card;
2. ``POST /console/billing/topup/pay {amount, setup}``: the grid reads the saved card from the provider's API (never
   from the browser), keeps it as the renter's payment method, and charges the amount now; the answer names the
   top-up, and carries a client secret when the card asks its holder to authenticate (the provider's script asks).

The balance grows only when the provider's signed webhook says the money arrived, exactly once (services/topups.py).
Both routes answer JSON: ``{"error": "..."}`` with the status of the error's class when refused. The billing page's
Content-Security-Policy (``billing_csp``) allows the provider's script, its frames and its API, and nothing else.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from common.errors import IdlegridError
from management.access_control import Action, Resource
from management.console import session
from management.console.middleware import SECURITY_HEADERS
from management.http.errors import status_of
from management.http.keys import SERVICES_KEY
from management.market.money import BadAmount, parse_amount
from management.payments.provider import BrowserStep

MAX_BODY = 4096


def billing_csp(step: BrowserStep | None) -> str:
    """The console's Content-Security-Policy, widened for the billing page by exactly the provider's script origin,
    its frames and its API (none without a card form)."""
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    if step is None:
        return policy
    scripts = " ".join(step.script_origins)
    connects = " ".join(step.connect_origins)
    policy = policy.replace("script-src 'self'", f"script-src 'self' {scripts}")
    policy = policy.replace("connect-src 'self'", f"connect-src 'self' {connects}")
    if step.frame_origins:
        policy += "; frame-src " + " ".join(step.frame_origins)
    return policy


def _refused(exc: IdlegridError) -> web.Response:
    status = status_of(exc)
    if status is None:  # no table maps it: the server's fault, a 500 and a log line (the middleware's)
        raise exc
    return web.json_response({"error": str(exc)}, status=status)


class TopupAsk(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the page's script posts: the amount as typed, and (to pay) the provider's id of the card setup."""

    amount: str = ""
    setup: Annotated[str, msgspec.Meta(max_length=255, pattern=r"^[A-Za-z0-9_]*\Z")] = ""


async def _ask(request: web.Request) -> TopupAsk:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    try:
        return msgspec.json.decode(await request.read(), type=TopupAsk)
    except msgspec.DecodeError as exc:
        raise web.HTTPBadRequest(text=f"not the top-up's JSON: {exc}") from None


def _amount(ask: TopupAsk) -> int | str:
    """The amount in micro-units, or why it is none."""
    if not ask.amount.strip():
        return "Amount: give the amount to add"
    try:
        return parse_amount(ask.amount.strip())
    except BadAmount as exc:
        return f"Amount: {exc}"


async def open_setup(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.TOPUPS, Action.WRITE)
    amount = _amount(await _ask(request))
    if isinstance(amount, str):
        return web.json_response({"error": amount}, status=400)
    try:
        setup = await request.app[SERVICES_KEY].billing_settings.start_card_setup(scope.principal.account, amount)
    except IdlegridError as exc:
        return _refused(exc)
    return web.json_response({"client_secret": setup.client_secret})


async def pay(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.TOPUPS, Action.WRITE)
    ask = await _ask(request)
    amount, setup = _amount(ask), ask.setup
    if isinstance(amount, str) or not setup:
        return web.json_response({"error": "give the amount and the provider's card setup"}, status=400)
    try:
        started = await request.app[SERVICES_KEY].billing_settings.pay_with_new_card(scope.principal.account, amount, setup)
    except IdlegridError as exc:
        return _refused(exc)
    return web.json_response({"topup": started.topup.id, "client_secret": started.client_secret})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/console/billing/topup/setup", open_setup)
    router.add_post("/console/billing/topup/pay", pay)
