"""Endpoints' answers (docs/endpoints.md, "The endpoint resource"): the spec as written, but the env's values and the
registry password are never shown again (the env's names and the username are); invocation keys by id and name, the
key itself only in the answer that created it."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from management.endpoints.scaler import EndpointScale
from management.endpoints.spec import EndpointKeyRecord, EndpointRecord, EndpointSpec, EndpointSpecJson
from management.market.money import format_amount
from management.views.base import Time, View, rfc3339
from management.views.workloads import RegistryAuthView, redact_registry_auth


class EndpointSpecView(EndpointSpec, forbid_unknown_fields=True):
    """The spec as written, but ``env`` is the sorted list of its names: the values are never shown again."""

    env: list[str] = []  # type: ignore[assignment]
    registry_auth: RegistryAuthView | None = None  # type: ignore[assignment]


class EndpointScaleView(View):
    """What the autoscaler's last tick found and decided (docs/endpoints.md, "The autoscaler's shell")."""

    at: Time
    workers: dict[str, int]  # by phase: starting, ready
    waiting: int  # requests queued
    desired: int  # the healthy workers its decision leaves
    why: str
    may_scale_up: bool  # False: its daily_spend_cap is reached (running workers finish; none starts)
    spent_24h: str | None  # what its workers cost in the last 24 hours, when it has a daily_spend_cap
    daily_spend_cap: str | None
    # Its latest workers' cold starts in seconds, oldest first (at most 20): from the worker asked for to its first call.
    cold_starts_s: list[float] = []


class EndpointView(View):
    id: str
    account: str
    name: str
    spec: EndpointSpecView
    created_at: Time
    updated_at: Time
    scale: EndpointScaleView | None = None  # None before the autoscaler's first tick on this Master
    # A load-balanced endpoint's one URL, on the Master's links listener (requests there go to its ready workers,
    # with an invocation key as 'Authorization: Bearer'); None in queue mode (its request routes are under /api/v1).
    url: str | None = None


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
    shown: EndpointSpecJson = msgspec.to_builtins(spec)
    shown["env"] = sorted(spec.env)
    return msgspec.convert(redact_registry_auth(shown), EndpointSpecView)


def endpoint_scale_view(scale: EndpointScale) -> EndpointScaleView:
    capped = scale.daily_spend_cap is not None
    return EndpointScaleView(
        at=rfc3339(scale.at) or "",
        workers=dict(scale.workers),
        waiting=scale.waiting,
        desired=scale.desired,
        why=scale.why,
        may_scale_up=scale.may_scale_up,
        spent_24h=format_amount(scale.spent) if capped else None,
        daily_spend_cap=format_amount(scale.daily_spend_cap) if scale.daily_spend_cap is not None else None,
        cold_starts_s=list(scale.cold_starts),
    )


def endpoint_view(e: EndpointRecord, scale: EndpointScale | None = None, url: str | None = None) -> EndpointView:
    return EndpointView(
        id=e.id,
        account=e.account,
        name=e.spec.name,
        spec=endpoint_spec_view(e.spec),
        created_at=rfc3339(e.created_at) or "",
        updated_at=rfc3339(e.updated_at) or "",
        scale=endpoint_scale_view(scale) if scale is not None else None,
        url=url,
    )


def endpoint_list_view(
    items: list[EndpointRecord],
    scale_of: Callable[[str], EndpointScale | None],
    url_of: Callable[[EndpointRecord], str | None] = lambda _e: None,
) -> EndpointList:
    return EndpointList(items=[endpoint_view(e, scale_of(e.id), url_of(e)) for e in items])


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
