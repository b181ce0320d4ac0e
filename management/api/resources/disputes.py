"""Disputes of rentals (docs/disputes.md): a renter opens one about its ended rental within the window, the disputed
host's provider answers it, the operator resolves it with a full, partial or no refund."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery, PageQuery
from management.payments.disputes import StateFilter, refund_amount
from management.services.disputes import DisputeKey
from management.views.disputes import dispute_view

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
Amount = Annotated[
    str, msgspec.Meta(min_length=1, max_length=32, description='a decimal amount of the grid\'s currency ("2.50")')
]
DISPUTES = "disputes"  # the resource a cursor of this list names
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+\Z")]


class OpenDispute(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/disputes: the renter's ended rental, why, and (for a rental of several hosts) which host."""

    rental: Id
    reason: Text
    agent_id: Id | None = None


class AnswerDispute(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/disputes/{id}/answer: the provider's side (it replaces an earlier answer)."""

    answer: Text


class ResolveDispute(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/disputes/{id}/resolution: ``full``, ``partial`` (with ``amount``, at most what is held) or
    ``none``; the operator's ``note`` says why."""

    resolution: Literal["full", "partial", "none"]
    amount: Amount | None = None
    note: Annotated[str, msgspec.Meta(max_length=4000)] = ""


class DisputeQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    """``state``: only open, answered or resolved disputes, or ``unresolved`` (open or answered)."""

    rental: Id | None = None
    state: StateFilter | None = None


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (OpenDispute, AnswerDispute, ResolveDispute, DisputeQuery)


async def open_dispute(request: web.Request) -> web.Response:
    body = await parse_body(request, OpenDispute)
    scope = scope_of(request)
    rec = await request.app[SERVICES_KEY].disputes.open(body.rental, body.reason, agent_id=body.agent_id, owner=scope.owner)
    return json_response(dispute_view(rec), status=201)


async def list_disputes(request: web.Request) -> web.Response:
    query = parse_query(request, DisputeQuery)
    scope = scope_of(request)
    page = await request.app[SERVICES_KEY].disputes.page(
        owner=scope.owner,
        role=scope.principal.role.value,
        rental_id=query.rental,
        after=decode_cursor(DISPUTES, query, DisputeKey),
        limit=query.limit,
        state=query.state,
    )
    return page_response(DISPUTES, query, page, dispute_view)


async def get_dispute(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    scope = scope_of(request)
    rec = await request.app[SERVICES_KEY].disputes.get(
        request.match_info["dispute_id"], owner=scope.owner, role=scope.principal.role.value
    )
    return json_response(dispute_view(rec))


async def answer_dispute(request: web.Request) -> web.Response:
    body = await parse_body(request, AnswerDispute)
    scope = scope_of(request)
    rec = await request.app[SERVICES_KEY].disputes.answer(
        request.match_info["dispute_id"], body.answer, owner=scope.owner, role=scope.principal.role.value
    )
    return json_response(dispute_view(rec))


async def resolve_dispute(request: web.Request) -> web.Response:
    body = await parse_body(request, ResolveDispute)
    scope = scope_of(request)
    rec = await request.app[SERVICES_KEY].disputes.resolve(
        request.match_info["dispute_id"], body.resolution, refund_amount(body.amount), body.note, by=scope.principal.account
    )
    return json_response(dispute_view(rec))


__all__ = ["REQUEST_SCHEMAS"]
