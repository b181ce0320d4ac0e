"""Secrets: an account's named values for its workloads (storage credentials, tokens in env). Created with their
value, which no answer ever carries again; listed by name; deleted. Each account sees and uses only its own."""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from management.api.audit import created
from management.api.auth import scope_of
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import EmptyQuery
from management.views.secrets import deleted_secret_view, secret_list_view, secret_view
from master.port import SECRET_NAME_PATTERN

SecretName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=SECRET_NAME_PATTERN)]
SecretValue = Annotated[str, msgspec.Meta(min_length=1, max_length=64 * 1024)]


class CreateSecret(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: SecretName
    value: SecretValue  # taken once: no answer shows it again


def _account(request: web.Request) -> str:
    return scope_of(request).principal.account  # always the caller's own: the operator's too


async def create_secret(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateSecret)
    listing = await request.app[SERVICES_KEY].secrets.create(_account(request), body.name, body.value)
    created(request, body.name)
    return json_response(secret_view(listing), status=201)


async def list_secrets(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    items = await request.app[SERVICES_KEY].secrets.list(_account(request))
    return json_response(secret_list_view(items))


async def delete_secret(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    name = request.match_info["name"]
    await request.app[SERVICES_KEY].secrets.delete(_account(request), name)
    return json_response(deleted_secret_view(name))
