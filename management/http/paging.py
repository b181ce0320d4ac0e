"""Cursor pagination: every list answers ``{"items": [...], "next_cursor": str | null}``.

A cursor is opaque to clients: base64url of ``[resource, query fingerprint, key]``, where ``key`` is
the sort key of the last item returned (keyset pagination: the next page starts strictly after it, so
items added or changed meanwhile never shift a page, and no page costs an offset scan in memory).
The fingerprint ties a cursor to the filters it was issued for: reused with other filters, or for
another resource, it is refused with a 400 instead of answering a page of something else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from management.http.errors import BadRequest
from management.http.requests import json_response
from management.http.schemas import PageQuery
from management.services.models import Page

T = TypeVar("T")
K = TypeVar("K", bound=msgspec.Struct)


def fingerprint(query: PageQuery) -> str:
    """Of the filters a list was asked with (all but limit and cursor): a cursor is valid only with the same."""
    filters = {k: v for k, v in msgspec.structs.asdict(query).items() if k not in ("limit", "cursor")}
    return hashlib.sha256(msgspec.json.encode(filters, order="sorted")).hexdigest()[:16]


def encode_cursor(resource: str, query: PageQuery, key: msgspec.Struct) -> str:
    raw = msgspec.json.encode([resource, fingerprint(query), key])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(resource: str, query: PageQuery, key_type: type[K]) -> K | None:
    """The key the page starts after (typed and bounded by ``key_type``), or None for the first page;
    BadRequest for a cursor that was not issued for this list and these filters."""
    if query.cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(query.cursor + "=" * (-len(query.cursor) % 4))
        name, issued_for, key = msgspec.json.decode(raw, type=tuple[str, str, msgspec.Raw])
        if name != resource or issued_for != fingerprint(query):
            raise BadRequest(
                "cursor was issued for another list or other filters; repeat the filters of the first page", code="bad_cursor"
            )
        return msgspec.json.decode(key, type=key_type)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise BadRequest("cursor is not one this API issued; pass back next_cursor unchanged", code="bad_cursor") from None


def page_response(resource: str, query: PageQuery, page: Page[T], render: Callable[[T], Any]) -> web.Response:
    next_cursor = encode_cursor(resource, query, page.next_key) if page.next_key is not None else None
    return json_response({"items": [render(item) for item in page.items], "next_cursor": next_cursor})
