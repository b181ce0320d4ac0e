"""One route of the management API, declared once (management/api/routing.py) and read by the router, the
authorization (management/api/auth.py) and the OpenAPI document (management/api/openapi.py).

A declaration names the method and path (as aiohttp's router writes them), the handler, what the route does in terms of
access control (a resource and an action, management/access_control.py; neither for a public route, served without a
key), and what the document says of it: a summary, a tag, the structs of its body, its query and each success answer,
the error statuses it may answer beyond those every route may, its media types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web

from management.access_control import Action, Resource
from management.http.errors import Handler

JSON = "application/json"
# What every authenticated route may answer besides its own: a bad query or body (or a Master refusal without a
# status of its own), no or a bad key, a role that may not, a key over its rate limit, a Master that is stopping.
COMMON_ERRORS = frozenset({400, 401, 403, 429, 503})
PUBLIC_ERRORS = frozenset({503})


class DeclarationError(ValueError):
    """A route declared inconsistently (an action without a resource, an answer-less route): a programming error
    found when the module is imported, never at a request."""


@dataclass(frozen=True, eq=False)  # told apart by identity: one declaration per route
class Route:
    """One route. ``resource``/``action``: what it does (both None: a public route, served without a key).
    ``answers``: success status -> the struct of its JSON body (None: a body the document does not model: ``{"type":
    "object"}`` for JSON, a string for other media). ``media``: the answer's content types (the struct describes the
    JSON one). ``errors``: statuses beyond ``COMMON_ERRORS`` (404 is added for a path with parameters, 413 for a
    body). ``invocation``: the route also takes an invocation key of the endpoint its path names (``{endpoint_id}``;
    management/api/auth.py), besides the API keys its resource and action let in; no other route does."""

    method: str
    path: str
    handler: Handler
    resource: Resource | None
    action: Action | None
    summary: str
    answers: Mapping[int, type[msgspec.Struct] | None]
    tag: str
    body: type[msgspec.Struct] | None = None
    query: type[msgspec.Struct] | None = None
    errors: frozenset[int] = frozenset()
    media: tuple[str, ...] = (JSON,)
    description: str = ""
    invocation: bool = False

    def __post_init__(self) -> None:
        if (self.resource is None) != (self.action is None):
            raise DeclarationError(f"{self.method} {self.path}: name both a resource and an action, or neither (public)")
        if self.invocation and (self.public or "endpoint_id" not in self.path_parameters):
            raise DeclarationError(f"{self.method} {self.path}: an invocation key is taken only on a path naming an endpoint")
        if not self.answers:
            raise DeclarationError(f"{self.method} {self.path}: declare at least one success answer")

    @property
    def key(self) -> tuple[str, str]:
        return self.method, self.path

    @property
    def public(self) -> bool:
        return self.resource is None

    @property
    def operation_id(self) -> str:
        words = re.sub(r"[{}]", "", self.path.removeprefix("/api/v1/")).replace("-", "_").replace(".", "_").split("/")
        return "_".join([self.method.lower(), *words])

    @property
    def path_parameters(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)

    @property
    def error_statuses(self) -> list[int]:
        statuses = set(PUBLIC_ERRORS if self.public else COMMON_ERRORS) | self.errors
        if self.path_parameters:
            statuses.add(404)
        if self.body is not None:
            statuses.add(413)  # a body over ApiSettings.max_body_bytes
        return sorted(statuses)


# The app's table of declared routes, (method, path) -> Route: the authorization reads it at every call.
DECLARED_KEY: web.AppKey[Mapping[tuple[str, str], Route]] = web.AppKey("declared_routes")
