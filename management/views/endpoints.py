"""Endpoints' answers (docs/endpoints.md, "The endpoint resource"): the spec as written, but the env's values and the
registry password are never shown again (the env's names and the username are); invocation keys by id and name, the
key itself only in the answer that created it."""

from __future__ import annotations

from typing import Any

import msgspec

from management.endpoints.spec import EndpointKeyRecord, EndpointRecord, EndpointSpec
from management.views.base import Time, View, rfc3339
from management.views.workloads import RegistryAuthView, redact_registry_auth


class EndpointSpecView(EndpointSpec, forbid_unknown_fields=True):
    """The spec as written, but ``env`` is the sorted list of its names: the values are never shown again."""

    env: list[str] = []  # type: ignore[assignment]
    registry_auth: RegistryAuthView | None = None  # type: ignore[assignment]


class EndpointView(View):
    id: str
    account: str
    name: str
    spec: EndpointSpecView
    created_at: Time
    updated_at: Time


class EndpointList(View):
    items: list[EndpointView]


class DeletedEndpoint(View):
    id: str
    deleted: bool  # always true: an endpoint not there answers 404


class EndpointKeyView(View):
    id: str
    endpoint: str
    name: str
    created_at: Time
    revoked_at: Time | None


class EndpointKeyList(View):
    items: list[EndpointKeyView]


class IssuedEndpointKeyView(EndpointKeyView):
    key: str  # shown this once: only its hash is kept


def endpoint_spec_view(spec: EndpointSpec) -> EndpointSpecView:
    shown: dict[str, Any] = msgspec.to_builtins(spec)
    shown["env"] = sorted(spec.env)
    return msgspec.convert(redact_registry_auth(shown), EndpointSpecView)


def endpoint_view(e: EndpointRecord) -> EndpointView:
    return EndpointView(
        id=e.id,
        account=e.account,
        name=e.spec.name,
        spec=endpoint_spec_view(e.spec),
        created_at=rfc3339(e.created_at) or "",
        updated_at=rfc3339(e.updated_at) or "",
    )


def endpoint_list_view(items: list[EndpointRecord]) -> EndpointList:
    return EndpointList(items=[endpoint_view(e) for e in items])


def deleted_endpoint_view(e: EndpointRecord) -> DeletedEndpoint:
    return DeletedEndpoint(id=e.id, deleted=True)


def endpoint_key_view(k: EndpointKeyRecord) -> EndpointKeyView:
    return EndpointKeyView(
        id=k.id, endpoint=k.endpoint, name=k.name, created_at=rfc3339(k.created_at) or "", revoked_at=rfc3339(k.revoked_at)
    )


def endpoint_key_list_view(keys: list[EndpointKeyRecord]) -> EndpointKeyList:
    return EndpointKeyList(items=[endpoint_key_view(k) for k in keys])


def issued_endpoint_key_view(key: str, k: EndpointKeyRecord) -> IssuedEndpointKeyView:
    return IssuedEndpointKeyView(**msgspec.structs.asdict(endpoint_key_view(k)), key=key)
