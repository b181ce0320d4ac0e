"""The operator's pages: the fleet at a glance (with every faulty GPU linked to its host), accounts and their API
keys, join tokens, revocations and events. The hosts list is the provider's page, unscoped (provider.py).

Every page names its (Resource, Action) and gets its scope from auth.py through ``signed_in``: these resources are
the operator's, so another role is refused (403) there, in one place. A key or token made here is shown once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlencode

import msgspec
from aiohttp import web

from management.access_control import Action, Resource
from management.console.forms import FormFields
from management.console.nav import NavItem
from management.console.pages.provider import when
from management.console.rendering import TemplateContext, page
from management.console.session import flash, signed_in
from management.http.errors import BadRequest
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, encode_cursor
from management.http.schemas import MAX_TOKEN_TTL_S, AccountName, Cursor, EventKindPrefix, Identifier, PageQuery
from management.services.accounts import AccountIdKey
from management.services.fleet import FleetFigures, UnitFigures
from management.services.grid import SeqKey

ACCOUNTS_CURSOR = "console-accounts"
EVENTS_CURSOR = "console-events"
LIST_PAGE = 50


# --- pure: façade answers to what the templates show --------------------------------------------------------------


@dataclass(frozen=True)
class FigureRow:
    name: str
    total: int
    busy: int
    available: int
    faulty: int
    offline: int
    utilization: str  # "37.5%", "-" when no GPU in service reported
    memory: str
    busy_pct: float  # busy / total, for a bar


def figure_row(figures: UnitFigures) -> FigureRow:
    def pct(value: float | None) -> str:
        return f"{value:.1f}%" if value is not None else "-"

    return FigureRow(
        name=figures.name,
        total=figures.total,
        busy=figures.busy,
        available=figures.available,
        faulty=figures.faulty,
        offline=figures.offline,
        utilization=pct(figures.utilization_pct),
        memory=pct(figures.memory_pct),
        busy_pct=round(100.0 * figures.busy / figures.total, 1) if figures.total else 0.0,
    )


def fleet_context(fleet: FleetFigures) -> TemplateContext:
    return {
        "total": figure_row(fleet.total),
        "hosts": fleet.hosts,
        "groups": [
            ("tier", "By tier", [figure_row(f) for f in fleet.by_tier]),
            ("region", "By region", [figure_row(f) for f in fleet.by_region]),
            ("model", "By model", [figure_row(f) for f in fleet.by_model]),
        ],
        "faulty": [
            {
                "uuid": g.uuid,
                "agent_id": g.agent_id,
                "index": g.index,
                "model": g.model or "unknown",
                "region": g.region,
                "reason": g.fault.reason if g.fault is not None else "marked faulty",
                "since": when(g.fault.since) if g.fault is not None else "-",
            }
            for g in fleet.faulty
        ],
        "faulty_count": fleet.faulty_count,
    }


class AccountsQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    limit: int = LIST_PAGE
    role: Identifier | None = None
    cursor: Cursor | None = None


class EventsQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    limit: int = LIST_PAGE
    kind: EventKindPrefix | None = None
    subject: Identifier | None = None
    cursor: Cursor | None = None


class TokenForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    csrf_token: str = ""
    provider: AccountName
    ttl_h: float | None = None

    def __post_init__(self) -> None:
        if self.ttl_h is not None and not 0 < self.ttl_h * 3600 <= MAX_TOKEN_TTL_S:
            raise ValueError(f"ttl_h must be more than 0 and at most {MAX_TOKEN_TTL_S / 3600:g} hours")


class KeyForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    csrf_token: str = ""
    name: str

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 64:
            raise ValueError("name must be 1 to 64 characters")


class RevokeForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    csrf_token: str = ""
    agent_id: Identifier


St = TypeVar("St", bound=msgspec.Struct)


def parse_fields(fields: FormFields, schema: type[St], what: str) -> St:
    """A query string or form as ``schema`` (an empty field is left out); BadRequest naming the wrong field."""
    given = {k: v.strip() for k, v in fields.items() if isinstance(v, str) and v.strip()}
    try:
        return msgspec.convert(given, schema, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise BadRequest(f"{what}: {exc}") from None


def _filters(query: msgspec.Struct) -> dict[str, str]:
    return {k: str(v) for k, v in msgspec.structs.asdict(query).items() if k not in ("limit", "cursor") and v is not None}


# --- the pages --------------------------------------------------------------------------------------------------


async def fleet_page(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.FLEET, Action.READ)
    return await page(request, "operator/fleet.html", title="Fleet", **fleet_context(request.app[SERVICES_KEY].hosts.fleet()))


async def accounts_page(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.ACCOUNTS, Action.WRITE)
    query = parse_fields(request.query, AccountsQuery, "the filters")
    found = await request.app[SERVICES_KEY].accounts.list_accounts(
        role=query.role, owner=scope.owner, after=decode_cursor(ACCOUNTS_CURSOR, query, AccountIdKey), limit=query.limit
    )
    next_link = None
    if found.next_key is not None:
        next_link = "?" + urlencode({**_filters(query), "cursor": encode_cursor(ACCOUNTS_CURSOR, query, found.next_key)})
    return await page(
        request, "operator/accounts.html", title="Accounts", accounts=found.items, query=query, next_link=next_link, when=when
    )


async def account_page(request: web.Request, *, issued: str = "") -> web.StreamResponse:
    scope = await signed_in(request, Resource.KEYS, Action.WRITE)
    account_id = request.match_info["account_id"]
    operations = request.app[SERVICES_KEY]
    account = await operations.accounts.get_account(account_id, owner=scope.owner)
    keys = await operations.accounts.list_api_keys(account_id, owner=scope.owner, limit=1000)
    return await page(
        request,
        "operator/account.html",
        title=f"Account {account_id}",
        subject=account,
        keys=keys.items,
        issued=issued,
        when=when,
    )


async def create_key(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.KEYS, Action.WRITE)
    form = parse_fields(await request.post(), KeyForm, "the key")
    issued = await request.app[SERVICES_KEY].accounts.create_api_key(
        request.match_info["account_id"], form.name, owner=scope.owner
    )
    # Shown in this answer only (never stored in the clear, never put in a cookie or a redirect).
    return await account_page(request, issued=issued.key)


async def revoke_key(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.KEYS, Action.WRITE)
    key = await request.app[SERVICES_KEY].accounts.revoke_api_key(request.match_info["key_id"], owner=scope.owner)
    await flash(request, f"API key {key.key_id} ({key.name}) is revoked: it is refused from now on.")
    raise web.HTTPSeeOther(f"/console/accounts/{quote(key.subject, safe='')}")


async def tokens_page(request: web.Request, *, issued: str = "", for_provider: str = "", expires: str = "") -> web.StreamResponse:
    await signed_in(request, Resource.TOKENS, Action.WRITE)
    providers = await request.app[SERVICES_KEY].accounts.list_accounts(role="provider", limit=1000)
    return await page(
        request,
        "operator/tokens.html",
        title="Join tokens",
        grid=str(request.url.origin()),
        providers=[a.id for a in providers.items],
        issued=issued,
        for_provider=for_provider,
        expires=expires,
    )


async def create_token(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.TOKENS, Action.WRITE)
    form = parse_fields(await request.post(), TokenForm, "the token")
    issued = await request.app[SERVICES_KEY].grid.create_token(form.provider, form.ttl_h * 3600 if form.ttl_h else None)
    return await tokens_page(request, issued=issued.token, for_provider=form.provider, expires=when(issued.record.expires_at))


async def revocations_page(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.AGENTS, Action.WRITE)
    found = await request.app[SERVICES_KEY].grid.list_revocations()
    return await page(request, "operator/revocations.html", title="Revocations", revocations=found, when=when)


async def revoke_host(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.AGENTS, Action.WRITE)
    form = parse_fields(await request.post(), RevokeForm, "the host")
    detail = await request.app[SERVICES_KEY].hosts.revoke(form.agent_id)
    await flash(request, f"Host {detail.agent.id} is revoked: its certificates are refused by every relay.")
    raise web.HTTPSeeOther("/console/revocations")


async def events_page(request: web.Request) -> web.StreamResponse:
    await signed_in(request, Resource.EVENTS, Action.READ)
    query = parse_fields(request.query, EventsQuery, "the filters")
    after = decode_cursor(EVENTS_CURSOR, query, SeqKey)
    found = await request.app[SERVICES_KEY].grid.list_events(
        subject=query.subject, kind=query.kind, after_seq=after.seq if after else 0, limit=query.limit
    )
    next_link = None
    if found.next_key is not None:
        next_link = "?" + urlencode({**_filters(query), "cursor": encode_cursor(EVENTS_CURSOR, query, found.next_key)})
    return await page(
        request,
        "operator/events.html",
        title="Events",
        events=found.items,
        query=query,
        next_link=next_link,
        first_link="?" + urlencode(_filters(query)) if query.cursor else None,
        when=when,
        data_text=lambda data: msgspec.json.encode(data).decode(),
    )


NAV = [
    NavItem("operator", "Fleet", "/console/fleet", 10),
    NavItem("operator", "Accounts", "/console/accounts", 30),
    NavItem("operator", "Join tokens", "/console/tokens", 40),
    NavItem("operator", "Revocations", "/console/revocations", 50),
    NavItem("operator", "Events", "/console/events", 60),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/fleet", fleet_page)
    router.add_get("/console/accounts", accounts_page)
    router.add_get("/console/accounts/{account_id}", account_page)
    router.add_post("/console/accounts/{account_id}/keys", create_key)
    router.add_post("/console/keys/{key_id}/revoke", revoke_key)
    router.add_get("/console/tokens", tokens_page)
    router.add_post("/console/tokens", create_token)
    router.add_get("/console/revocations", revocations_page)
    router.add_post("/console/revocations", revoke_host)
    router.add_get("/console/events", events_page)
