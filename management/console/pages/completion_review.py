"""The operator's completion review in the console (docs/disputes.md, "Completion rates"): the hosts whose rate of
rentals not ended through them fell below the grid's threshold are held (not offered, no new work) until an operator
reviews them. The page lists them with their counts by close reason; clearing one is the API's review
(``MarketService.review_completion``: recorded, its count starts afresh, it is offered again). Keeping one held is
doing nothing: it stays out of the offers, and its own page can drain or revoke it.

Only the operator reviews (the API's ``agents`` write): a provider asking answers 403, and cannot clear its own host.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from management.access_control import Action, Resource
from management.console import session
from management.console.audit import record_write
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.keys import SERVICES_KEY

__all__ = ["NAV", "add_routes"]


async def review_page(request: web.Request) -> web.Response:
    await session.signed_in(request, Resource.AGENTS, Action.WRITE)
    services = request.app[SERVICES_KEY]
    policy = services.market.completion_policy
    return await page(
        request, "operator/completion_review.html", title="Completion review", held=services.market.hosts_under_review(),
        threshold=policy.threshold, min_rentals=policy.min_rentals,
    )  # fmt: skip


async def clear_review(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.AGENTS, Action.WRITE)
    agent_id = request.match_info["agent_id"]
    before = request.app[SERVICES_KEY].market.completion(agent_id, owner=None)  # 404 for a host the grid does not know
    rate = await request.app[SERVICES_KEY].market.review_completion(agent_id, by=scope.principal.account)
    await record_write(request, scope, 303, agent_id)
    seen = f"{before.rate * 100:.0f}% of {before.rentals} rentals" if before.rate is not None else f"{before.rentals} rentals"
    held = " It is still under review." if rate.under_review else " It is offered again; its count starts afresh."
    await session.flash(request, f"Host {agent_id} reviewed (it had {seen}).{held}")
    back = (await request.post()).get("back")
    if back == "host":
        raise web.HTTPSeeOther(f"/console/hosts/{quote(agent_id, safe='')}")
    raise web.HTTPSeeOther("/console/completion-review")


NAV = [NavItem("operator", "Completion review", "/console/completion-review", order=27)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/completion-review", review_page)
    router.add_post("/console/hosts/{agent_id}/completion-review", clear_review)
