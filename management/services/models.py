"""What the services share: a page of a list and the bounded pieces its cursor keys are made of.

Lists are keyset-paginated: a service method takes the key of the last item of the previous page (``after``) and a
``limit``, and returns a ``Page`` whose ``next_key`` continues it (None at the end). Keys are encoded as JSON arrays
inside the API's cursors; anyone can build a cursor, so every field of a key is bounded. Each service keeps its own
keys beside it; the ones here are used by several.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

import msgspec

T = TypeVar("T")

KeyText = Annotated[str, msgspec.Meta(max_length=128)]
Position = Annotated[int, msgspec.Meta(ge=0, le=10**9)]


class PositionKey(msgspec.Struct, array_like=True, frozen=True):
    position: Position  # in a short list kept in memory, in its own order


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_key: msgspec.Struct | None  # the sort key of the last item, when more may follow


def page_of(items: list[T], limit: int, key: Callable[[T], msgspec.Struct]) -> Page[T]:
    """``items`` holds up to ``limit + 1`` candidates: one more than asked says that another page follows."""
    if len(items) > limit:
        return Page(items[:limit], key(items[limit - 1]))
    return Page(items, None)


def positioned_page(items: list[T], after: PositionKey | None, limit: int) -> Page[T]:
    """A page of a short list kept whole, keyed by the position in it."""
    start = after.position + 1 if after else 0
    page = page_of(list(enumerate(items[start : start + limit + 1], start)), limit, lambda k: PositionKey(k[0]))
    return Page([item for _, item in page.items], page.next_key)
