"""SSH (docs/ssh.md): public keys (each account adds, lists and deletes its own; the operator anyone's), and a
workload's host keys with the lines ``~/.ssh/config`` and ``known_hosts`` take.

The platform's SSH end (the agent, through a tunnel) lets a session in only with a key of the account that opened the
tunnel: the workload's owner, or an operator. It proves itself with the workload's host key, published here.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.errors import Forbidden
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery
from management.views.ssh import ssh_key_list_view, ssh_key_view, workload_ssh_view

AccountId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class AddSshKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/ssh-keys: an OpenSSH public key line (``ssh-ed25519 AAAA... me@laptop``); ``name`` defaults to its
    comment; ``account``: the operator may add a key to another account (a renter's key is always its own)."""

    public_key: Annotated[str, msgspec.Meta(min_length=1, max_length=16384)]
    name: Annotated[str, msgspec.Meta(max_length=100)] = ""
    account: AccountId | None = None


class SshKeyQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /api/v1/ssh-keys: the caller's keys; the operator's call, every account's or ``account``'s."""

    account: AccountId | None = None


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (AddSshKey, SshKeyQuery)


async def add_ssh_key(request: web.Request) -> web.Response:
    body = await parse_body(request, AddSshKey)
    scope = scope_of(request)
    if scope.owner is not None:
        if body.account is not None and body.account != scope.owner:
            raise Forbidden(f"a {scope.principal.role.value} key adds SSH keys to its own account only, not {body.account!r}")
        account = scope.owner
    else:
        account = body.account or scope.principal.account
    record = await request.app[SERVICES_KEY].ssh_keys.add(account, body.public_key, name=body.name)
    return json_response(ssh_key_view(record), status=201)


async def list_ssh_keys(request: web.Request) -> web.Response:
    query = parse_query(request, SshKeyQuery)
    keys = await request.app[SERVICES_KEY].ssh_keys.list(owner=scope_of(request).owner, account=query.account)
    return json_response(ssh_key_list_view(keys))


async def delete_ssh_key(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    await request.app[SERVICES_KEY].ssh_keys.delete(request.match_info["key_id"], owner=scope_of(request).owner)
    return web.Response(status=204)


async def workload_ssh(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    workload, keys = await request.app[SERVICES_KEY].ssh_keys.host_keys(
        request.match_info["workload_id"], owner=scope_of(request).owner
    )
    return json_response(workload_ssh_view(workload, keys))
