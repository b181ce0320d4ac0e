"""The renter's launch templates page and the workloads' links (docs/templates.md, docs/links.md).

- ``/console/templates``: the catalog as cards (what each runs, its GPUs, disk and ports); "Launch" submits the
  template's workload under the name typed (``services.templates.launch_spec`` then ``services.workloads``), and goes
  to the workload's page, where its links show once it runs.
- ``/console/workloads/{id}/links/{port}``: opens a link in the browser. A private link gets a link token minted for
  the signed-in account (the owner's, or the operator's) and the browser goes to ``URL?idlegrid_token=...``, which the
  link turns into a cookie of its own: the console's session cookie never leaves ``/console``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from common.errors import Conflict
from management.access_control import Action, Resource, acting_account
from management.console import session
from management.console.forms import FormErrors, text
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.errors import validation_message
from management.http.keys import SERVICES_KEY
from management.links.names import TOKEN_QUERY
from management.services.market import PaymentRequired
from master.port import SpecJson, WorkloadSpec


async def gallery(request: web.Request, *, errors: FormErrors | None = None, form: Any = None) -> web.Response:
    await session.signed_in(request, Resource.TEMPLATES, Action.READ)
    listed = request.app[SERVICES_KEY].templates.list_templates()
    errors = errors or FormErrors()
    return await page(
        request, "renter/templates.html", status=400 if errors else 200, title="Launch templates",
        templates=listed, errors=errors, form=form or {},
    )  # fmt: skip


async def launch(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    services = request.app[SERVICES_KEY]
    name = request.match_info["name"]
    form = await request.post()
    errors = FormErrors()
    workload_name = text(form, "name", max_length=63) or name
    overrides: SpecJson = {"name": workload_name}
    try:
        spec = msgspec.convert(services.templates.launch_spec(name, overrides), WorkloadSpec)
    except msgspec.ValidationError as exc:
        errors.add(f"name-{name}", validation_message(exc, "the workload"))
        return await gallery(request, errors=errors, form=form)
    try:
        record = await services.workloads.submit_workload(acting_account(scope, None), spec)
    except (PaymentRequired, Conflict) as exc:  # money before work, or work that can never run here: said on the card
        errors.add(f"name-{name}", str(exc))
        return await gallery(request, errors=errors, form=form)
    await session.flash(request, f"Launched {name} as {record.id} ({spec.name}): {record.state}. Its links open once it runs.")
    raise web.HTTPSeeOther(f"/console/workloads/{record.id}")


async def open_link(request: web.Request) -> web.Response:
    """To the link in this browser, with a token for the signed-in account when it is private."""
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.READ)
    links = request.app[SERVICES_KEY].links
    text_port = request.match_info["port"]
    port = int(text_port) if text_port.isdigit() else 0
    minted = await links.mint(request.match_info["workload_id"], port, account=scope.principal.account, owner=scope.owner)
    listed = {v.port: v for v in await links.list_links(request.match_info["workload_id"], owner=scope.owner)}
    if listed[port].public:
        raise web.HTTPSeeOther(minted.url)
    raise web.HTTPSeeOther(f"{minted.url}?{TOKEN_QUERY}={minted.token}")


NAV = [NavItem("renter", "Templates", "/console/templates", order=15)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/templates", gallery)
    router.add_post("/console/templates/{name}/launch", launch)
    router.add_get("/console/workloads/{workload_id}/links/{port}", open_link)
