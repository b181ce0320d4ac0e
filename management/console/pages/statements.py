"""Statements per account and period (docs/payments.md, "Statements"): an account's ledger entries of one UTC day, ISO
week or month with the opening and closing balances, as a page and as CSV; for a provider, its payout account (connect
it, finish the payment provider's onboarding) and its payouts of matured earnings."""

from __future__ import annotations

import time

from aiohttp import web

from common.errors import NotFound
from management.access_control import Action, Resource
from management.console.nav import NavItem
from management.console.rendering import page
from management.console.session import flash, signed_in
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.market.ledger import InvalidLedgerRequest, period_span
from management.market.money import format_amount
from management.payments.payouts import period_label
from management.payments.provider import PaymentProviderError
from management.payments.topups import PaymentsNotConfigured

LINES_SHOWN = 1000


def _period(request: web.Request) -> str:
    """The asked period's label (this UTC month by default); a 400 naming the shapes otherwise."""
    label = request.query.get("period", "").strip() or period_label(time.time(), "month")
    try:
        period_span(label)
    except InvalidLedgerRequest as exc:
        raise BadRequest(str(exc)) from None
    return label


def _account(request: web.Request, owner: str | None) -> str:
    return owner or request.query.get("account", "").strip()


async def statements_page(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.LEDGER, Action.READ)
    period = _period(request)
    account = _account(request, scope.owner)
    if not account:  # the operator names the account
        return await page(request, "statements.html", title="Statements", ask_account=True, period=period, for_account=account)
    services = request.app[SERVICES_KEY]
    statement = await services.market.ledger_statement(account, owner=scope.owner, after_seq=0, limit=LINES_SHOWN, period=period)
    payout_account, payouts, payable, onboarding_url = None, [], 0, ""
    is_provider = any(a.startswith("provider:") for a in statement.accounts)
    if is_provider:
        try:  # read again from the payment provider: its owner may come back from its onboarding
            payout_account = await services.payouts.payout_account(account)
        except NotFound:
            payout_account = None
        except PaymentProviderError:
            payout_account = await services.payouts.payout_account(account, refresh=False)
        if request.query.get("onboard") and payout_account is not None and not payout_account.payouts_enabled:
            back = f"{request.url.origin()}/console/statements"
            connected = await services.payouts.connect(account, return_url=back, refresh_url=back)
            onboarding_url = connected.link.url if connected.link is not None else ""
        payouts = await services.payouts.list_payouts(owner=scope.owner, account=account)
        payable = await services.payouts.payable(account)
    return await page(
        request, "statements.html", title="Statements", ask_account=False, statement=statement,
        currency=services.market.currency, is_provider=is_provider, payout_account=payout_account, payouts=payouts,
        payable=payable, period=period, for_account=account, money=format_amount, onboarding_url=onboarding_url,
    )  # fmt: skip


async def statement_csv(request: web.Request) -> web.Response:
    scope = await signed_in(request, Resource.LEDGER, Action.READ)
    period = _period(request)
    account = _account(request, scope.owner)
    if not account:
        raise BadRequest("account: an operator names the account whose statement to download")
    market = request.app[SERVICES_KEY].market
    statement = await market.ledger_statement(account, owner=scope.owner, after_seq=0, limit=100_000, period=period)
    return web.Response(
        text=market.statement_csv(statement),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="statement-{account}-{period}.csv"'},
    )


async def connect_payout_account(request: web.Request) -> web.Response:
    """Make the provider's payout account (once); the page then links to the payment provider's hosted onboarding (a
    link, not a redirect: the console's Content-Security-Policy lets a form lead only to the console)."""
    scope = await signed_in(request, Resource.PAYOUTS, Action.WRITE)
    account = scope.principal.account
    back = f"{request.url.origin()}/console/statements"
    try:
        connected = await request.app[SERVICES_KEY].payouts.connect(account, return_url=back, refresh_url=back)
    except PaymentsNotConfigured as exc:
        await flash(request, f"Not connected: {exc}")
        raise web.HTTPSeeOther("/console/statements") from None
    if connected.link is None:
        await flash(request, "Your payout account can take payouts.")
        raise web.HTTPSeeOther("/console/statements")
    await flash(request, "Payout account made: give your bank details on the payment provider's page (the link below).")
    raise web.HTTPSeeOther("/console/statements?onboard=1")


NAV = [
    NavItem("renter", "Statements", "/console/statements", order=45),
    NavItem("provider", "Statements", "/console/statements", order=25),
    NavItem("operator", "Statements", "/console/statements", order=90),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/statements", statements_page)
    router.add_get("/console/statements.csv", statement_csv)
    router.add_post("/console/statements/payout-account", connect_payout_account)
