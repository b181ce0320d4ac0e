"""Disputes of rentals in the console (docs/disputes.md, "Console"): a renter opens one about its ended rental (from the
rental on its workload's page, or from the billing page) and follows it; the disputed host's provider reads it and
answers; the operator reads the evidence bundle and resolves it with a full, partial or no refund.

Every form calls the DisputeService the API calls (``Services.disputes``), with the signed-in account as the owner,
and the access rules the API reads (management/access_control.py): another renter's rental or another provider's
dispute answers 404, as a missing one does; a role that may not act answers 403. What the rules refuse (an empty
reason, an amount that is not one or not within what is held, a closed window, a resolved dispute) is said beside the
form, and nothing moves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from common.errors import Conflict
from management.access_control import AccountRole, Action, Resource, Scope, permitted
from management.console import session
from management.console.audit import record_write
from management.console.forms import FormErrors, text
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, encode_cursor
from management.http.schemas import Cursor, PageQuery
from management.market.money import format_amount
from management.payments.disputes import (
    MAX_TEXT,
    RESOLUTIONS,
    DisputeRecord,
    InvalidDispute,
    StateFilter,
    check_window,
    clean_text,
    refund_amount,
)
from management.services.disputes import DisputeKey

__all__ = ["NAV", "RentalDisputes", "add_routes", "rental_disputes"]

PAGE = 50  # disputes a page of the list shows; "Older disputes" reads the next
DISPUTES_CURSOR = "console-disputes"
FILTERS = {
    "": "all",
    "unresolved": "not resolved (open or answered)",
    "open": "open (not answered yet)",
    "answered": "answered by the provider",
    "resolved": "resolved",
}
RESOLUTION_LABELS = {
    "full": "Full refund: everything held and the platform's fee back to the renter",
    "partial": "Partial refund: the amount below to the renter, the rest back to the provider",
    "none": "No refund: everything held back to the provider",
}


@dataclass(frozen=True)
class RentalDisputes:
    """What a page listing rentals says of disputing them: each rental's disputes, whether this account may open one,
    and the window (a rental is disputed within ``window_s`` of its end)."""

    by_rental: dict[str, list[DisputeRecord]] = field(default_factory=dict)
    may_open: bool = False
    window_s: float = 0.0


async def rental_disputes(request: web.Request, scope: Scope, rental_ids: Iterable[str]) -> RentalDisputes:
    """The disputes of these rentals that the signed-in account may read (none for a role that reads no disputes)."""
    role = scope.principal.role
    if not permitted(role, Resource.DISPUTES, Action.READ):
        return RentalDisputes()
    disputes = request.app[SERVICES_KEY].disputes
    by_rental = {rid: await disputes.list_disputes(owner=scope.owner, role=role.value, rental_id=rid) for rid in rental_ids}
    return RentalDisputes(by_rental, permitted(role, Resource.DISPUTES, Action.WRITE), disputes.window_s)


def _said(exc: Exception) -> str:
    """A rule's message as the sentence beside a field ("the reason must say why" -> "The reason must say why")."""
    message = str(exc)
    return message[:1].upper() + message[1:]


def _role(scope: Scope) -> str:
    return scope.principal.role.value


class DisputesQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    """The list's filter and where its page starts (a cursor is bound to the state it was issued for)."""

    state: StateFilter | None = None
    cursor: Cursor | None = None


async def disputes_page(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTES, Action.READ)
    role = _role(scope)
    state = request.query.get("state", "unresolved" if role == "operator" else "")
    if state not in FILTERS:
        raise BadRequest(f"state: one of {', '.join(f for f in FILTERS if f)} (or none for all), not {state[:40]!r}")
    # Paged as the API's list is, the state filtered by the store: a page holds the disputes the filter keeps, however
    # many others are newer (the cursor is bound to the state it was issued for).
    try:
        fields = {"state": state or None, "cursor": request.query.get("cursor") or None, "limit": PAGE}
        query = msgspec.convert(fields, DisputesQuery)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"the filters: {exc}") from None
    services = request.app[SERVICES_KEY]
    found = await services.disputes.page(
        owner=scope.owner,
        role=role,
        rental_id=None,
        after=decode_cursor(DISPUTES_CURSOR, query, DisputeKey),
        limit=PAGE,
        state=query.state,
    )
    kept = {"state": state}  # "" too: the operator's list without it is the unresolved one
    next_link = None
    if found.next_key is not None:
        next_link = "?" + urlencode({**kept, "cursor": encode_cursor(DISPUTES_CURSOR, query, found.next_key)})
    return await page(
        request, "disputes/disputes.html", title="Disputes", disputes=found.items, state=state, filters=FILTERS,
        next_link=next_link, first_link=("?" + urlencode(kept)) if query.cursor else None, money=format_amount,
        currency=services.market.currency, window_days=services.disputes.window_s / 86400,
    )  # fmt: skip


async def dispute_page(
    request: web.Request, *, errors: FormErrors | None = None, form: dict[str, str] | None = None, status: int = 200
) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTES, Action.READ)
    role = scope.principal.role
    services = request.app[SERVICES_KEY]
    rec = await services.disputes.get(request.match_info["dispute_id"], owner=scope.owner, role=role.value)
    open_ = rec.state != "resolved"
    return await page(
        request, "disputes/dispute.html", status=status, title=f"Dispute {rec.id}", d=rec, money=format_amount,
        currency=services.market.currency, errors=errors if errors is not None else FormErrors(), form=form or {},
        # The host's provider gives its side here; the operator may answer for it through the API, not this page.
        may_answer=open_ and role is AccountRole.PROVIDER and permitted(role, Resource.DISPUTE_ANSWERS, Action.WRITE),
        may_resolve=open_ and permitted(role, Resource.DISPUTE_RESOLUTIONS, Action.WRITE),
        sees_workload=permitted(role, Resource.WORKLOADS, Action.READ), resolutions=RESOLUTION_LABELS,
        max_text=MAX_TEXT,
    )  # fmt: skip


async def _new_dispute_page(
    request: web.Request, scope: Scope, rental_id: str, *, errors: FormErrors | None = None,
    form: dict[str, str] | None = None, status: int = 200,
) -> web.Response:  # fmt: skip
    """The form for one rental (another renter's answers 404, as reading it does), saying when it cannot be disputed
    (still running, past the window) and which of its hosts are disputed already."""
    services = request.app[SERVICES_KEY]
    errors = errors if errors is not None else FormErrors()
    rental = None
    closed, taken = "", {}
    if rental_id:
        detail = await services.market.get_rental(rental_id, owner=scope.owner, role=_role(scope))
        rental = detail.rental
        try:
            check_window(rental, time.time(), services.disputes.window_s)
        except Conflict as exc:
            closed = str(exc)
        found = await services.disputes.list_disputes(owner=scope.owner, role=_role(scope), rental_id=rental.id)
        taken = {d.agent_id: d for d in found}
    window_s = services.disputes.window_s
    return await page(
        request, "disputes/new.html", status=status, title="Open a dispute", rental=rental, rental_id=rental_id,
        closed=closed, taken=taken, errors=errors, form=form or {}, max_text=MAX_TEXT, window_days=window_s / 86400,
        deadline=(rental.ended_at + window_s) if rental is not None and rental.ended_at is not None else None,
    )  # fmt: skip


async def new_dispute(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTES, Action.WRITE)
    return await _new_dispute_page(request, scope, text(request.query, "rental", max_length=200))


async def open_dispute(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTES, Action.WRITE)
    posted = await request.post()
    rental_id = text(posted, "rental", max_length=200)
    form = {"reason": text(posted, "reason", max_length=2 * MAX_TEXT), "agent_id": text(posted, "agent_id", max_length=200)}
    errors = FormErrors()
    if not rental_id:
        errors.add("rental", "Rental: give the id of the rental to dispute (its workload's page lists them)")
        return await _new_dispute_page(request, scope, "", errors=errors, form=form, status=400)
    try:
        reason = clean_text(form["reason"], "the reason", required=True)
    except InvalidDispute as exc:
        errors.add("reason", _said(exc))
        return await _new_dispute_page(request, scope, rental_id, errors=errors, form=form, status=400)
    try:
        rec = await request.app[SERVICES_KEY].disputes.open(
            rental_id, reason, agent_id=form["agent_id"] or None, owner=scope.owner
        )
    except InvalidDispute as exc:  # the host named is not one of the rental's, or it ran on several and none is named
        errors.add("agent_id", _said(exc))
        return await _new_dispute_page(request, scope, rental_id, errors=errors, form=form, status=400)
    except Conflict as exc:  # still running, past the window, or this host of it already disputed
        errors.add("form", f"Not opened: {exc}")
        return await _new_dispute_page(request, scope, rental_id, errors=errors, form=form, status=409)
    await record_write(request, scope, 303, rec.id)
    currency = request.app[SERVICES_KEY].market.currency
    await session.flash(
        request,
        f"Dispute {rec.id} opened: {format_amount(rec.held)} {currency} is held off the provider's earnings until an "
        "operator resolves it.",
    )
    raise web.HTTPSeeOther(f"/console/disputes/{rec.id}")


async def answer_dispute(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTE_ANSWERS, Action.WRITE)
    dispute_id = request.match_info["dispute_id"]
    said = text(await request.post(), "answer", max_length=2 * MAX_TEXT)
    errors = FormErrors()
    try:
        answer = clean_text(said, "the answer", required=True)
        rec = await request.app[SERVICES_KEY].disputes.answer(dispute_id, answer, owner=scope.owner, role=_role(scope))
    except InvalidDispute as exc:
        errors.add("answer", _said(exc))
        return await dispute_page(request, errors=errors, form={"answer": said}, status=400)
    except Conflict as exc:  # resolved meanwhile: the page shows no answer form any more
        errors.add("form", f"Not answered: {exc}")
        return await dispute_page(request, errors=errors, form={"answer": said}, status=409)
    await record_write(request, scope, 303, rec.id)
    await session.flash(request, f"Your answer to dispute {rec.id} is recorded; the operator reads it before resolving.")
    raise web.HTTPSeeOther(f"/console/disputes/{rec.id}")


async def resolve_dispute(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.DISPUTE_RESOLUTIONS, Action.WRITE)
    posted = await request.post()
    form = {
        "resolution": text(posted, "resolution", max_length=32),
        "amount": text(posted, "amount", max_length=64),
        "note": text(posted, "note", max_length=2 * MAX_TEXT),
    }
    errors = FormErrors()
    resolution = form["resolution"]
    if resolution not in RESOLUTIONS:
        errors.add("resolution", "Resolution: choose a full, partial or no refund")
    amount = None
    try:
        amount = refund_amount(form["amount"] or None)
    except InvalidDispute as exc:
        errors.add("amount", _said(exc))
    try:
        note = clean_text(form["note"], "the note", required=False)
    except InvalidDispute as exc:
        errors.add("note", _said(exc))
    if errors:
        return await dispute_page(request, errors=errors, form=form, status=400)
    try:
        rec = await request.app[SERVICES_KEY].disputes.resolve(
            request.match_info["dispute_id"], resolution, amount, note, by=scope.principal.account
        )
    except InvalidDispute as exc:  # the amount against what is held, or an amount given with a full or no refund
        errors.add("amount", _said(exc))
        return await dispute_page(request, errors=errors, form=form, status=400)
    except Conflict as exc:  # resolved already: the page shows the outcome, and no form
        errors.add("form", f"Not resolved: {exc}")
        return await dispute_page(request, errors=errors, form=form, status=409)
    await record_write(request, scope, 303, rec.id)
    currency = request.app[SERVICES_KEY].market.currency
    await session.flash(
        request,
        f"Dispute {rec.id} resolved ({rec.resolution}): {format_amount(rec.refunded)} {currency} refunded to "
        f"{rec.account}, {format_amount(rec.released)} {currency} released to {rec.provider}.",
    )
    raise web.HTTPSeeOther(f"/console/disputes/{rec.id}")


NAV = [
    NavItem("renter", "Disputes", "/console/disputes", order=42),
    NavItem("provider", "Disputes", "/console/disputes", order=22),
    NavItem("operator", "Disputes", "/console/disputes", order=25),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/disputes", disputes_page)
    router.add_get("/console/disputes/new", new_dispute)
    router.add_post("/console/disputes", open_dispute)
    router.add_get("/console/disputes/{dispute_id}", dispute_page)
    router.add_post("/console/disputes/{dispute_id}/answer", answer_dispute)
    router.add_post("/console/disputes/{dispute_id}/resolution", resolve_dispute)
