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
from management.services.ssh_keys import host_alias
from management.views.base import Time, View, rfc3339
from master.port import SshKeyRecord

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


class SshKeyView(View):
    id: str
    account: str
    name: str
    public_key: str
    fingerprint: str
    created_at: Time


class SshKeyList(View):
    items: list[SshKeyView]


class ReplicaSshView(View):
    replica: int
    host: str  # the name ssh knows it by (Host in ~/.ssh/config, the proxy's %h)
    agent_id: str
    state: str
    host_key: str | None  # null: its host reported none (an older agent); restart the workload to get one
    known_hosts: str | None  # the line for ~/.ssh/known_hosts


class WorkloadSshView(View):
    workload: str
    replicas: list[ReplicaSshView]


def ssh_key_view(k: SshKeyRecord) -> SshKeyView:
    return SshKeyView(
        id=k.id,
        account=k.account,
        name=k.name,
        public_key=k.public_key,
        fingerprint=k.fingerprint,
        created_at=rfc3339(k.created_at) or "",
    )


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
    return json_response(SshKeyList(items=[ssh_key_view(k) for k in keys]))


async def delete_ssh_key(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    await request.app[SERVICES_KEY].ssh_keys.delete(request.match_info["key_id"], owner=scope_of(request).owner)
    return web.Response(status=204)


async def workload_ssh(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    workload, keys = await request.app[SERVICES_KEY].ssh_keys.host_keys(
        request.match_info["workload_id"], owner=scope_of(request).owner
    )
    replicas = []
    for k in keys:
        alias = host_alias(workload.id, k.replica)
        line = f"{alias} {k.host_key}" if k.host_key else None
        replicas.append(
            ReplicaSshView(
                replica=k.replica, host=alias, agent_id=k.agent_id, state=k.state, host_key=k.host_key, known_hosts=line
            )
        )
    return json_response(WorkloadSshView(workload=workload.id, replicas=replicas))
