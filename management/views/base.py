"""The pieces every answer shares: ``View``, the base of every answer's struct; ``Time`` and ``Money``, how times
and amounts are written; ``page_of``, a list's page; and ``rfc3339``/``instant``, which write a time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec

# Keyword arguments gathered for a Struct (a view, a query, a ticket) or a call before it is made: that Struct's own
# decoding, or the call's signature, checks them, so they are open until then.
StructFields = dict[str, Any]

# An RFC 3339 UTC time with milliseconds, as ``rfc3339`` below writes it; null (where allowed) for "never".
Time = Annotated[
    str, msgspec.Meta(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z", description="RFC 3339 UTC")
]


# Money: a decimal string in the grid's currency with at least two decimals, exact to the micro-unit ("2.50", "-0.000125").
Money = Annotated[str, msgspec.Meta(pattern=r"^-?[0-9]+\.[0-9]{2,6}\Z", description="a decimal amount in the grid's currency")]


class View(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every answer's struct: unknown fields are refused (``additionalProperties: false``)."""


def page_of(item: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """The ``{"items": [...], "next_cursor": str | null}`` shape of a list of ``item`` (management/http/paging.py),
    named ``<Item>Page`` (a name OpenAPI accepts, unlike a generic's ``Page[Item]``)."""
    name = item.__name__.removesuffix("View") + "Page"
    return msgspec.defstruct(
        name,
        [("items", list[item]), ("next_cursor", str | None)],  # type: ignore[valid-type]
        kw_only=True,
        forbid_unknown_fields=True,
        module=__name__,
    )


def rfc3339(ts: float | None) -> str | None:
    """Unix seconds as RFC 3339 UTC with milliseconds; None (null) for None or 0 (never)."""
    return instant(ts) if ts else None


def instant(ts: float) -> str:
    """Unix seconds as RFC 3339 UTC with milliseconds, the epoch included: for a window's bounds, where 0 is a time
    someone asked for, not "never" (rfc3339's None)."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
