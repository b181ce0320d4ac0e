"""Providers' prices (the market): a provider's default and its hosts' own prices, and the price in force on a host.

A provider reads and sets its own; the operator anyone's (``provider`` in the body or the query). The price in force
on a host is public, as offers show it: any account reads it. Amounts are decimal strings per GPU-hour, with the
currency. Every write is audited by the audit middleware (management/api/audit.py).
"""

from __future__ import annotations

from aiohttp import web

from management.access_control import acting_provider
from management.api.audit import created
from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery, PriceQuery, SetDefaultPrice, SetPrice
from management.market.prices import PriceSetting
from management.services.prices import HostPriceDetail
from management.views.prices import host_price_view, price_listing_view, price_record_view


def _setting(body: SetPrice) -> PriceSetting:
    return PriceSetting(
        on_demand=body.on_demand,
        min_bid=body.min_bid,
        reserved_discount=body.reserved_discount,
        max_duration_s=body.max_duration_s,
    )


def _render(detail: HostPriceDetail) -> web.Response:
    return json_response(host_price_view(detail.agent_id, detail.provider, detail.price, detail.currency))


async def list_prices(request: web.Request) -> web.Response:
    query = parse_query(request, PriceQuery)
    listing = await request.app[SERVICES_KEY].prices.list_prices(owner=scope_of(request).owner, provider=query.provider)
    return json_response(price_listing_view(listing.records, listing.grid_default, listing.currency))


async def set_default_price(request: web.Request) -> web.Response:
    body = await parse_body(request, SetDefaultPrice)
    provider = acting_provider(scope_of(request), body.provider)
    created(request, provider)  # the audit event names the provider whose default changed
    detail = await request.app[SERVICES_KEY].prices.set_default_price(provider, _setting(body))
    return json_response(price_record_view(detail.record, detail.currency))


async def set_host_price(request: web.Request) -> web.Response:
    body = await parse_body(request, SetPrice)
    agent_id = request.match_info["agent_id"]
    return _render(await request.app[SERVICES_KEY].prices.set_host_price(agent_id, _setting(body), owner=scope_of(request).owner))


async def clear_host_price(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    agent_id = request.match_info["agent_id"]
    return _render(await request.app[SERVICES_KEY].prices.clear_host_price(agent_id, owner=scope_of(request).owner))


async def get_host_price(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    return _render(await request.app[SERVICES_KEY].prices.host_price(request.match_info["agent_id"]))
