"""Serverless endpoints (docs/endpoints.md, "The endpoint resource"): create, list, show, update, delete, and their
invocation keys (create, shown once; list; revoke). A renter sees and changes only its own (another's answers 404);
the operator any account's. The request routes, which take invocation keys, are not here yet."""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from common.containers import RegistryAuth
from management.access_control import acting_account
from management.api.auth import scope_of
from management.endpoints.spec import (
    MAX_CONCURRENCY,
    MAX_HELD,
    MAX_HOLD_S,
    MAX_WORKERS,
    EndpointMode,
    EndpointSpec,
    EndpointSpecJson,
)
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_body, parse_query
from management.http.schemas import AccountName, EmptyQuery
from management.views.endpoints import (
    deleted_endpoint_view,
    endpoint_key_list_view,
    endpoint_key_view,
    endpoint_list_view,
    endpoint_view,
    issued_endpoint_key_view,
)
from master.port import (
    Amount,
    CommandArg,
    EnvName,
    EnvValue,
    ImageRef,
    LabelKey,
    LabelValue,
    PlacementConstraints,
    ReplicaSpec,
    ShortText,
    WorkloadName,
)

UNSET = msgspec.UNSET
Seconds = Annotated[float, msgspec.Meta(ge=0, le=7 * 86400.0)]


class CreateEndpoint(EndpointSpec, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/endpoints: an endpoint spec, and for an operator the account it belongs to."""

    account: AccountName | None = None  # a renter's key creates for its own account; an operator names one

    def spec(self) -> EndpointSpec:
        return EndpointSpec(**{name: getattr(self, name) for name in EndpointSpec.__struct_fields__})


class ScalingChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The scaling fields to change; those left out keep their value."""

    min_workers: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKERS)] | msgspec.UnsetType = UNSET
    max_workers: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKERS)] | msgspec.UnsetType = UNSET
    idle_timeout_s: Seconds | msgspec.UnsetType = UNSET
    target_queue_delay_s: Seconds | msgspec.UnsetType = UNSET
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONCURRENCY)] | msgspec.UnsetType = UNSET


class UpdateEndpoint(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PATCH /api/v1/endpoints/{endpoint_id}: the spec's fields to change; those left out keep their value. ``scaling``
    changes the fields it names; ``replica``, ``constraints``, ``env`` and ``labels`` are replaced whole (the env's
    values are never shown, so send every variable again); ``registry_auth`` null removes the credentials."""

    name: WorkloadName | msgspec.UnsetType = UNSET
    image: ImageRef | msgspec.UnsetType = UNSET
    command: Annotated[list[CommandArg], msgspec.Meta(max_length=256)] | msgspec.UnsetType = UNSET
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=256)] | msgspec.UnsetType = UNSET
    replica: ReplicaSpec | msgspec.UnsetType = UNSET
    constraints: PlacementConstraints | msgspec.UnsetType = UNSET
    priority: ShortText | msgspec.UnsetType = UNSET
    project: ShortText | msgspec.UnsetType = UNSET
    labels: Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=64)] | msgspec.UnsetType = UNSET
    registry_auth: RegistryAuth | None | msgspec.UnsetType = UNSET
    scaling: ScalingChange | msgspec.UnsetType = UNSET
    execution_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86400.0)] | msgspec.UnsetType = UNSET
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400.0)] | msgspec.UnsetType = UNSET
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] | msgspec.UnsetType = UNSET
    daily_spend_cap: Amount | None | msgspec.UnsetType = UNSET  # null removes the cap
    mode: EndpointMode | msgspec.UnsetType = UNSET
    http_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | msgspec.UnsetType = UNSET
    readiness_path: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | msgspec.UnsetType = UNSET
    max_held: Annotated[int, msgspec.Meta(ge=0, le=MAX_HELD)] | msgspec.UnsetType = UNSET
    max_hold_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_HOLD_S)] | msgspec.UnsetType = UNSET

    def changes(self) -> EndpointSpecJson:
        """The fields given, as JSON (those left out are not there; a null ``registry_auth`` is)."""
        return {
            name: msgspec.to_builtins(value) for name in self.__struct_fields__ if (value := getattr(self, name)) is not UNSET
        }


class EndpointQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /api/v1/endpoints: the caller's endpoints; the operator's call, every account's or ``account``'s."""

    account: AccountName | None = None


class CreateEndpointKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/endpoints/{endpoint_id}/keys: a name to tell the key apart by."""

    name: Annotated[str, msgspec.Meta(max_length=100)] = ""


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (CreateEndpoint, UpdateEndpoint, EndpointQuery, CreateEndpointKey)


async def create_endpoint(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateEndpoint)
    account = acting_account(scope_of(request), body.account)
    endpoints = request.app[SERVICES_KEY].endpoints
    record = await endpoints.create(account, body.spec())
    return json_response(endpoint_view(record, url=endpoints.url_of(record)), status=201)


async def list_endpoints(request: web.Request) -> web.Response:
    query = parse_query(request, EndpointQuery)
    endpoints = request.app[SERVICES_KEY].endpoints
    found = await endpoints.list(owner=scope_of(request).owner, account=query.account)
    return json_response(endpoint_list_view(found, endpoints.scale_of, endpoints.url_of))


async def get_endpoint(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    endpoints = request.app[SERVICES_KEY].endpoints
    record = await endpoints.get(request.match_info["endpoint_id"], account=scope_of(request).owner)
    return json_response(endpoint_view(record, endpoints.scale_of(record.id), endpoints.url_of(record)))


async def update_endpoint(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateEndpoint)
    endpoints = request.app[SERVICES_KEY].endpoints
    record = await endpoints.update(request.match_info["endpoint_id"], body.changes(), account=scope_of(request).owner)
    return json_response(endpoint_view(record, endpoints.scale_of(record.id), endpoints.url_of(record)))


async def delete_endpoint(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    record = await request.app[SERVICES_KEY].endpoints.delete(request.match_info["endpoint_id"], account=scope_of(request).owner)
    return json_response(deleted_endpoint_view(record))


async def create_endpoint_key(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateEndpointKey)
    issued = await request.app[SERVICES_KEY].endpoints.create_key(
        request.match_info["endpoint_id"], body.name, account=scope_of(request).owner
    )
    return json_response(issued_endpoint_key_view(issued.key, issued.record), status=201)


async def list_endpoint_keys(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    keys = await request.app[SERVICES_KEY].endpoints.keys(request.match_info["endpoint_id"], account=scope_of(request).owner)
    return json_response(endpoint_key_list_view(keys))


async def revoke_endpoint_key(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    revoked = await request.app[SERVICES_KEY].endpoints.revoke_key(
        request.match_info["endpoint_id"], request.match_info["key_id"], account=scope_of(request).owner
    )
    return json_response(endpoint_key_view(revoked))
