"""The market: offers and their search, renting an offer, bids, balances, the ledger and statements, rentals.

Money goes in and out as decimal strings in the grid's currency ("2.50"), exact to the micro-unit; every answer about a
workload's money states the rental kind and the price in force (docs/market.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from aiohttp import web

from management.access_control import acting_account
from management.api.auth import scope_of
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, encode_cursor
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import AccountName, EmptyQuery, EventSeq, Identifier, PageLimit, PageQuery
from management.market.money import BadAmount, parse_amount
from management.views.market import (
    credited_view,
    earnings_view,
    funds_view,
    offer_view,
    payouts_view,
    rental_view,
    search_view,
    spend_view,
    statement_view,
)
from management.views.workloads import workload_view
from master.port import Amount, WorkloadSpec

RENTALS = "rentals"

# --- requests --------------------------------------------------------------------------------------------------------

OfferQueryText = Annotated[str, msgspec.Meta(max_length=2000)]
SortText = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^-?[a-z_]+\Z")]
Memo = Annotated[str, msgspec.Meta(max_length=256)]


class OfferQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /api/v1/offers: ``q`` in the offer query language (docs/offers.md), ``sort`` a field (``-field``:
    descending), a cursor from the previous page."""

    q: OfferQueryText = ""
    sort: SortText | None = None
    limit: PageLimit = 50
    cursor: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None


class RentOffer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/offers/{offer_id}/rent: the workload to run on that host (its ``rental`` says on demand,
    interruptible with a bid, or reserved; the offer is filled in), and for an operator the account."""

    spec: WorkloadSpec
    account: AccountName | None = None


class ChangeBid(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/workloads/{workload_id}/bid: the new bid per GPU-hour of an interruptible workload."""

    bid: Amount


class Credit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/accounts/{account_id}/credit: money onto a renter's balance (the operator's, for now)."""

    amount: Amount
    memo: Memo = ""
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+\Z")] | None = None


class LedgerQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    after: EventSeq = 0  # entries after this sequence number
    limit: PageLimit = 100
    format: Literal["json", "csv"] = "json"
    # one UTC day (2026-12-07), ISO week (2026-W50) or month (2026-12): that period's entries only (a statement)
    period: Annotated[str, msgspec.Meta(max_length=10, pattern=r"^[0-9]{4}-(W[0-9]{2}|[0-9]{2}(-[0-9]{2})?)\Z")] | None = None


class PayoutQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    period: Literal["day", "week", "month"] = "day"


class RentalQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    workload: Identifier | None = None
    agent_id: Identifier | None = None
    open: bool | None = None


class Rate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/rentals/{rental_id}/rating: the renter's rating of an ended rental, 1 (bad) to 5 (good)."""

    rating: Annotated[int, msgspec.Meta(ge=1, le=5)]


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (
    OfferQuery,
    RentOffer,
    ChangeBid,
    Credit,
    LedgerQuery,
    PayoutQuery,
    RentalQuery,
    Rate,
)


def _amount(field: str, text: str) -> int:
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise BadRequest(f"{field}: {exc}") from None


# --- offers ----------------------------------------------------------------------------------------------------------


async def search_offers(request: web.Request) -> web.Response:
    query = parse_query(request, OfferQuery)
    result = await request.app[SERVICES_KEY].market.search_offers(
        query.q, sort=query.sort, limit=query.limit, cursor=query.cursor
    )
    return json_response(search_view(result))


async def get_offer(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    offer = await request.app[SERVICES_KEY].market.get_offer(request.match_info["offer_id"])
    return json_response(offer_view(offer))


async def rent_offer(request: web.Request) -> web.Response:
    body = await parse_body(request, RentOffer)
    account = acting_account(scope_of(request), body.account)
    market = request.app[SERVICES_KEY].market
    record = await market.rent_offer(account, request.match_info["offer_id"], body.spec)
    return json_response(workload_view(record, market.workload_terms(record)), status=201)


async def change_bid(request: web.Request) -> web.Response:
    body = await parse_body(request, ChangeBid)
    market = request.app[SERVICES_KEY].market
    record = await market.change_bid(request.match_info["workload_id"], _amount("bid", body.bid), account=scope_of(request).owner)
    return json_response(workload_view(record, market.workload_terms(record)))


# --- money -----------------------------------------------------------------------------------------------------------


async def get_balance(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    funds = await request.app[SERVICES_KEY].market.funds(request.match_info["account_id"], owner=scope_of(request).owner)
    return json_response(funds_view(funds))


async def credit_account(request: web.Request) -> web.Response:
    body = await parse_body(request, Credit)
    market = request.app[SERVICES_KEY].market
    account_id = request.match_info["account_id"]
    entry = await market.credit(account_id, _amount("amount", body.amount), body.memo, key=body.key)
    funds = await market.funds(account_id)
    return json_response(credited_view(entry, funds), status=201)


async def get_ledger(request: web.Request) -> web.Response:
    query = parse_query(request, LedgerQuery)
    market = request.app[SERVICES_KEY].market
    statement = await market.ledger_statement(
        request.match_info["account_id"],
        owner=scope_of(request).owner,
        after_seq=query.after,
        limit=query.limit,
        period=query.period or "",
    )
    if query.format == "csv":
        name = (
            f"statement-{request.match_info['account_id']}-{query.period}"
            if query.period
            else "ledger-" + request.match_info["account_id"]
        )
        return web.Response(
            text=market.statement_csv(statement),
            content_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{name}.csv"'},
        )
    return json_response(statement_view(statement, market.currency))


async def get_spend(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    spend = await request.app[SERVICES_KEY].market.spend(request.match_info["account_id"], owner=scope_of(request).owner)
    return json_response(spend_view(spend))


async def get_earnings(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    earnings = await request.app[SERVICES_KEY].market.earnings(request.match_info["account_id"], owner=scope_of(request).owner)
    return json_response(earnings_view(earnings))


async def get_payouts(request: web.Request) -> web.Response:
    query = parse_query(request, PayoutQuery)
    payouts = await request.app[SERVICES_KEY].market.payouts(
        request.match_info["account_id"], query.period, owner=scope_of(request).owner
    )
    return json_response(payouts_view(payouts))


# --- rentals ---------------------------------------------------------------------------------------------------------


class RentalKey(msgspec.Struct, array_like=True, frozen=True):
    listed: Annotated[str, msgspec.Meta(max_length=200)]  # management.store.rentals.rental_order of the last one shown


async def list_rentals(request: web.Request) -> web.Response:
    query = parse_query(request, RentalQuery)
    scope = scope_of(request)
    after = decode_cursor(RENTALS, query, RentalKey)
    rentals, next_key = await request.app[SERVICES_KEY].market.list_rentals(
        owner=scope.owner,
        role=scope.principal.role.value,
        workload=query.workload,
        agent_id=query.agent_id,
        open_only=bool(query.open),
        after=after.listed if after is not None else None,
        limit=query.limit,
    )
    provider = scope.principal.role.value == "provider"
    next_cursor = encode_cursor(RENTALS, query, RentalKey(next_key)) if next_key is not None else None
    return json_response({"items": [rental_view(r, for_provider=provider) for r in rentals], "next_cursor": next_cursor})


async def get_rental(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    scope = scope_of(request)
    role = scope.principal.role.value
    rental = await request.app[SERVICES_KEY].market.get_rental(request.match_info["rental_id"], owner=scope.owner, role=role)
    return json_response(rental_view(rental, for_provider=role == "provider"))


async def rate_rental(request: web.Request) -> web.Response:
    body = await parse_body(request, Rate)
    scope = scope_of(request)
    market = request.app[SERVICES_KEY].market
    role = scope.principal.role.value
    rental = await market.rate_rental(request.match_info["rental_id"], body.rating, owner=scope.owner, role=role)
    return json_response(rental_view(rental, for_provider=False))


__all__ = ["REQUEST_SCHEMAS"]
