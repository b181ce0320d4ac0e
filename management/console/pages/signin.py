"""Signing in and out, the console's home, and the signed-in account's own page (its password)."""

from __future__ import annotations

from aiohttp import web

from common.errors import InvalidPassword, SignInRefused
from management.access_control import Action, Resource, permitted
from management.console import session
from management.console.nav import NavItem
from management.console.rendering import NAV_KEY, page
from management.console.throttle import SignInThrottle
from management.http.keys import SERVICES_KEY

THROTTLE_KEY = web.AppKey("console_signin_throttle", SignInThrottle)
MAX_FIELD = 1100  # longer than any account id or password that can be set


def _safe_next(target: str) -> str:
    """Where to go after signing in: a console path only (never another site: ``//host`` or ``/console@host``)."""
    if target.startswith("/console/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/console/"


async def signin_form(request: web.Request) -> web.Response:
    if request.get(session.SIGNED_IN_KEY) is not None:
        raise web.HTTPSeeOther(_safe_next(request.query.get("next", "/console/")))
    return await page(request, "signin.html", title="Sign in", next=_safe_next(request.query.get("next", "")), account_id="")


async def signin(request: web.Request) -> web.Response:
    form = await request.post()
    account_id = str(form.get("account", "")).strip()[:MAX_FIELD]
    password = str(form.get("password", ""))[:MAX_FIELD]
    target = _safe_next(str(form.get("next", "")))
    wait_s = request.app[THROTTLE_KEY].wait_s(account_id, request.remote or "")
    if wait_s > 0:
        response = await page(
            request,
            "signin.html",
            status=429,
            title="Sign in",
            next=target,
            account_id=account_id,
            error=f"Too many sign-in attempts; try again in {int(wait_s) + 1} s.",
        )
        response.headers["Retry-After"] = str(int(wait_s) + 1)
        return response
    if not account_id or not password:
        return await page(
            request, "signin.html", status=400, title="Sign in", next=target, account_id=account_id,
            error="Enter your account and your password.",
        )  # fmt: skip
    try:
        account = await request.app[SERVICES_KEY].accounts.sign_in(account_id, password, address=request.remote or "")
    except SignInRefused as exc:
        return await page(
            request, "signin.html", status=401, title="Sign in", next=target, account_id=account_id, error=f"{exc}."
        )
    await session.begin(request, account)
    raise web.HTTPSeeOther(target)


async def signout(request: web.Request) -> web.Response:
    await session.end(request)
    raise web.HTTPSeeOther("/console/signin")


async def home(request: web.Request) -> web.Response:
    """The role's first page; a short welcome where its role has none yet."""
    account = session.signed_in_account(request)
    items: list[NavItem] = request.app[NAV_KEY]
    for item in sorted(items, key=lambda i: (i.order, i.label)):
        if item.role == account.role and item.path != "/console/account":
            raise web.HTTPSeeOther(item.path)
    return await page(request, "home.html", title="Console")


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


async def account_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    scope = await session.signed_in(request, Resource.ACCOUNTS, Action.READ)
    keeps_secrets = permitted(scope.principal.role, Resource.SECRETS, Action.READ)  # the link to its secrets page
    return await page(request, "account.html", title="Your account", error=error, status=status, keeps_secrets=keeps_secrets)


async def change_password(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.PASSWORD, Action.WRITE)
    form = await request.post()
    new, again = str(form.get("password", "")), str(form.get("password_again", ""))
    if new != again:
        return await account_page(request, error="The two new passwords differ.", status=400)
    try:
        await request.app[SERVICES_KEY].accounts.set_password(
            scope.principal.account,
            new,
            owner=scope.owner,
            by=scope.principal.account,
            current_password=str(form.get("current_password", "")),
        )
    except InvalidPassword as exc:
        return await account_page(request, error=str(exc), status=400)
    await session.end(request)
    await session.flash(request, "Password changed: sign in with the new one (your other sessions ended too).")
    raise web.HTTPSeeOther("/console/signin")


NAV = [NavItem(role, "Account", "/console/account", order=1000) for role in ("operator", "provider", "renter")]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", root)
    router.add_get("/console", root)
    router.add_get("/console/", home)
    router.add_get("/console/signin", signin_form)
    router.add_post("/console/signin", signin)
    router.add_post("/console/signout", signout)
    router.add_get("/console/account", account_page)
    router.add_post("/console/account/password", change_password)
