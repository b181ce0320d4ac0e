"""The provider's "Add a host" page: a fresh join token for the signed-in provider (the operator picks the provider)
and the one-line command for a host with Docker, with Podman or with no container engine, each fetching install.sh
from this Master (management/onboarding/, docs/install-provider.md). The token is made by a POST (a form with the
CSRF field) and shown in that answer only, as the operator's join tokens page does."""

from __future__ import annotations

import msgspec
from aiohttp import web

from management.access_control import Action, Resource
from management.console.nav import NavItem
from management.console.pages.operator import parse_fields
from management.console.pages.provider import when
from management.console.rendering import page
from management.console.session import signed_in
from management.http.keys import SERVICES_KEY
from management.http.schemas import AccountName
from management.onboarding.routes import grid_url
from management.onboarding.script import InstallCommand

# A token for a host being set up now: an hour is enough to paste the command, short enough if it leaks.
ADD_HOST_TOKEN_TTL_S = 3600.0


class AddHostForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    csrf_token: str = ""
    provider: AccountName | None = None  # the operator's choice; a provider's own account otherwise


async def add_host_page(
    request: web.Request, *, commands: list[InstallCommand] | None = None, for_provider: str = "", expires: str = ""
) -> web.StreamResponse:
    scope = await signed_in(request, Resource.HOST_ENROLLMENT, Action.WRITE)
    operations = request.app[SERVICES_KEY]
    if scope.owner:
        providers = [scope.owner]
    else:
        providers = [a.id for a in (await operations.accounts.list_accounts(role="provider", limit=1000)).items]
    return await page(
        request,
        "provider/add_host.html",
        title="Add a host",
        commands=commands or [],
        providers=providers,
        operator=scope.owner is None,
        for_provider=for_provider,
        expires=expires,
        grid=grid_url(request),
        access_url=operations.onboarding.access_url(),
    )


async def create_host_token(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.HOST_ENROLLMENT, Action.WRITE)
    form = parse_fields(await request.post(), AddHostForm, "the host")
    # A provider's token is always for itself, whatever the form says; the operator must name the provider.
    provider = scope.owner or form.provider
    if not provider:
        raise web.HTTPSeeOther("/console/add-host")
    operations = request.app[SERVICES_KEY]
    issued = await operations.grid.create_token(provider, ADD_HOST_TOKEN_TTL_S)
    return await add_host_page(
        request,
        commands=operations.onboarding.commands(grid_url(request), issued.token),
        for_provider=provider,
        expires=when(issued.record.expires_at),
    )


NAV = [NavItem("provider", "Add a host", "/console/add-host", 15)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/add-host", add_host_page)
    router.add_post("/console/add-host", create_host_token)
