"""Rendering a console page: the template with what every page shows (the account, the navigation with its counts,
notices)."""

from __future__ import annotations

from typing import Any

import aiohttp_jinja2
from aiohttp import web

from common.errors import IdlegridError
from management.access_control import Action, Resource
from management.console.nav import NavItem
from management.console.session import SIGNED_IN_KEY, session_state, signed_in, take_flashes
from management.http.keys import SERVICES_KEY

NAV_KEY: web.AppKey[list[NavItem]] = web.AppKey("console_nav")

# What a Jinja template reads (a page's context, a row or a section of it), or the JSON a page's chart script reads:
# each template names its own keys, so it is open here.
TemplateContext = dict[str, Any]


async def nav_counts(request: web.Request) -> dict[str, int]:
    """The counts the navigation shows beside its entries (``NavItem.badge``) for the signed-in account: ``alerts``,
    its firing alerts, as the alerts page lists them (one pass over the alerts in memory, filtered by the façade)."""
    try:
        scope = await signed_in(request, Resource.ALERTS, Action.READ)
        listing = await request.app[SERVICES_KEY].alerts.list_alerts(
            owner=scope.owner, role=scope.principal.role.value, phase="firing"
        )
    except IdlegridError:  # a role without alerts, or none to read: no badge, the page itself still renders
        return {}
    return {"alerts": len(listing.active)}


async def page(request: web.Request, template: str, *, status: int = 200, fragment: bool = False, **context: Any) -> web.Response:
    """``template`` (under management/console/templates/) rendered in the layout, answered with ``status``;
    ``fragment``: a part of a page that a page fetches (htmx), which leaves the session's notices for the next page."""
    account = request.get(SIGNED_IN_KEY)
    state = await session_state(request)
    nav = [item for item in request.app[NAV_KEY] if account is not None and item.role == account.role]
    base = {
        "account": account,
        "csrf_token": state.csrf,
        "flashes": [] if fragment else await take_flashes(request),
        "nav": sorted(nav, key=lambda item: (item.order, item.label)),
        "nav_counts": await nav_counts(request) if account is not None and not fragment else {},
        "path": request.path,
    }
    response = aiohttp_jinja2.render_template(template, request, {**base, **context}, status=status)
    return response
