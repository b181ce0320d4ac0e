"""The renter's billing settings in the console (docs/payments.md), on its billing page: the saved payment method
(shown by the provider's label; saving one takes the provider's own payment element, or `idlegrid billing
payment-method`), auto top-up, and (with spend caps) its limits. Each form posts here and comes back to the billing
page with what was done or why not; the service decides, as for the API."""

from __future__ import annotations

from aiohttp import web

from common.errors import Conflict, IdlegridError
from management.access_control import Action, Resource
from management.console import session
from management.console.forms import FormErrors, amount, integer, word
from management.http.keys import SERVICES_KEY
from management.market.money import format_amount, parse_amount
from management.payments.caps import describe
from management.payments.records import AutoTopup, BillingRecord, SpendCap

BILLING_PAGE = "/console/billing"


async def settings_of(request: web.Request, account: str) -> BillingRecord | None:
    """The account's billing settings for the page; None for an account that has none to set (not a renter)."""
    try:
        return await request.app[SERVICES_KEY].billing_settings.get(account)
    except Conflict:
        return None


async def set_auto_topup(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.TOPUPS, Action.WRITE)
    form = await request.post()
    errors = FormErrors()
    enabled = form.get("enabled") == "on"
    threshold = amount(form, "threshold", errors, label="Threshold")
    charge = amount(form, "amount", errors, label="Amount")
    if errors:
        await session.flash(request, "Auto top-up not changed: " + "; ".join(errors.values()))
        raise web.HTTPSeeOther(BILLING_PAGE)
    setting = None
    if enabled:
        if threshold is None or charge is None:
            await session.flash(request, "Auto top-up not changed: give a threshold and an amount to turn it on.")
            raise web.HTTPSeeOther(BILLING_PAGE)
        setting = AutoTopup(threshold=parse_amount(threshold), amount=parse_amount(charge))
    service = request.app[SERVICES_KEY].billing_settings
    try:
        saved = await service.set_auto_topup(scope.principal.account, setting)
    except IdlegridError as exc:
        await session.flash(request, f"Auto top-up not changed: {exc}")
        raise web.HTTPSeeOther(BILLING_PAGE) from None
    auto = saved.auto_topup
    said = (
        f"Auto top-up on: {format_amount(auto.amount)} {service.currency} when the balance falls below "
        f"{format_amount(auto.threshold)} {service.currency}, at most once an hour."
        if auto is not None
        else "Auto top-up off."
    )
    await session.flash(request, said)
    raise web.HTTPSeeOther(BILLING_PAGE)


async def add_cap(request: web.Request) -> web.Response:
    """One more cap, beside those the renter has (the service checks them all together)."""
    scope = await session.signed_in(request, Resource.TOPUPS, Action.WRITE)
    form = await request.post()
    errors = FormErrors()
    limit = amount(form, "limit", errors, label="Limit")
    window = form.get("window")
    project = word(form, "project", errors, label="Project") if form.get("project") else None
    if window not in ("hour", "month"):
        errors.add("window", "Per: choose an hour or a month")
    if limit is None and "limit" not in errors:
        errors.add("limit", "Limit: give an amount")
    if errors:
        await session.flash(request, "Cap not added: " + "; ".join(errors.values()))
        raise web.HTTPSeeOther(BILLING_PAGE)
    assert limit is not None and window in ("hour", "month")  # checked above
    cap = SpendCap(
        scope="project" if project else "account",
        project=project or "",
        window="hour" if window == "hour" else "month",
        limit=parse_amount(limit),
        hard=form.get("hard") == "on",
    )
    service = request.app[SERVICES_KEY].billing_settings
    try:
        current = await service.get(scope.principal.account)
        await service.set_caps(scope.principal.account, [*current.caps, cap])
    except IdlegridError as exc:
        await session.flash(request, f"Cap not added: {exc}")
        raise web.HTTPSeeOther(BILLING_PAGE) from None
    await session.flash(request, f"Added {describe(cap, service.currency)}.")
    raise web.HTTPSeeOther(BILLING_PAGE)


async def remove_cap(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.TOPUPS, Action.WRITE)
    form = await request.post()
    errors = FormErrors()
    service = request.app[SERVICES_KEY].billing_settings
    current = await service.get(scope.principal.account)
    index = integer(form, "cap", errors, label="Cap", low=0, high=max(0, len(current.caps) - 1))
    if index is None or not current.caps:
        await session.flash(request, "No such cap.")
        raise web.HTTPSeeOther(BILLING_PAGE)
    removed = current.caps[index]
    await service.set_caps(scope.principal.account, [c for n, c in enumerate(current.caps) if n != index])
    await session.flash(request, f"Removed {describe(removed, service.currency)}.")
    raise web.HTTPSeeOther(BILLING_PAGE)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/console/billing/auto-topup", set_auto_topup)
    router.add_post("/console/billing/caps/add", add_cap)
    router.add_post("/console/billing/caps/remove", remove_cap)
