"""Accounts and their API keys, and whoami.

The operator creates, lists and changes accounts and manages every account's keys. Any other account
reads its own account and manages its own keys (create, list, revoke); another account answers 404.
A key is shown once, when it is created; afterwards only its public ``key_id`` and its dates are.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from management.api.audit import created
from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, page_response
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import AccountQuery, CreateAccount, CreateApiKey, EmptyQuery, PageQuery, SetPassword, UpdateAccount
from management.services.accounts import AccountIdKey
from management.services.models import PositionKey
from management.views.accounts import account_view, api_key_view, issued_api_key_view, whoami_view
from master.port import AccountChange, AccountRecord

ACCOUNTS = "accounts"
KEYS = "keys"


async def whoami(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    principal = scope_of(request).principal
    account = await request.app[SERVICES_KEY].accounts.get_account(principal.account)
    view = whoami_view(principal.account, principal.role.value, principal.key_id, principal.name, account.name)
    return json_response(view)


async def create_account(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateAccount)
    account = await request.app[SERVICES_KEY].accounts.create_account(AccountRecord(**msgspec.structs.asdict(body)))
    created(request, account.id)
    return json_response(account_view(account), status=201)


async def list_accounts(request: web.Request) -> web.Response:
    query = parse_query(request, AccountQuery)
    page = await request.app[SERVICES_KEY].accounts.list_accounts(
        role=query.role,
        owner=scope_of(request).owner,
        after=decode_cursor(ACCOUNTS, query, AccountIdKey),
        limit=query.limit,
    )
    return page_response(ACCOUNTS, query, page, account_view)


async def get_account(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    account = await request.app[SERVICES_KEY].accounts.get_account(
        request.match_info["account_id"], owner=scope_of(request).owner
    )
    return json_response(account_view(account))


async def update_account(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateAccount)
    change = AccountChange(**msgspec.structs.asdict(body))
    account = await request.app[SERVICES_KEY].accounts.update_account(request.match_info["account_id"], change)
    return json_response(account_view(account))


async def create_api_key(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateApiKey)
    issued = await request.app[SERVICES_KEY].accounts.create_api_key(
        request.match_info["account_id"], body.name, owner=scope_of(request).owner
    )
    created(request, issued.record.key_id)
    return json_response(issued_api_key_view(issued.key, issued.record), status=201)


async def list_api_keys(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    page = await request.app[SERVICES_KEY].accounts.list_api_keys(
        request.match_info["account_id"],
        owner=scope_of(request).owner,
        after=decode_cursor(KEYS, query, PositionKey),
        limit=query.limit,
    )
    return page_response(KEYS, query, page, api_key_view)


async def revoke_api_key(request: web.Request) -> web.Response:
    key = await request.app[SERVICES_KEY].accounts.revoke_api_key(request.match_info["key_id"], owner=scope_of(request).owner)
    return json_response(api_key_view(key))


async def set_password(request: web.Request) -> web.Response:
    """The operator sets anyone's password; an account sets its own (giving the current one, when it has one)."""
    body = await parse_body(request, SetPassword)
    scope = scope_of(request)
    account = await request.app[SERVICES_KEY].accounts.set_password(
        request.match_info["account_id"],
        body.password,
        owner=scope.owner,
        by=scope.principal.account,
        current_password=body.current_password,
    )
    return json_response(account_view(account))
