"""The renter's offers: the search page (menus of the models, tiers and regions offered now, the common filters, a raw
query box, columns sorted on the server by a link each, paged by cursor) and one offer in detail (the host's CPU, RAM,
disk and network, each GPU with its driver, CUDA and measured figures, the price in force, its price and availability
history, and Rent).

Everything works without JavaScript: filters are a GET form, a column's sort is a link (``sort=price`` or
``sort=-price``) that keeps the filters and starts from the first page, and the pager's links keep the sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from common.errors import BadQuery
from management.access_control import Action, Resource
from management.console import session
from management.console.forms import FormErrors, amount, integer, number, text, word
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.keys import SERVICES_KEY
from management.market.money import format_amount
from management.market.offer_history import StateSpan
from master.port import MAX_GPUS_PER_REPLICA

OFFERS_PER_PAGE = 25


@dataclass(frozen=True)
class Column:
    """A column of the offers table: its heading, the offer field it sorts by, and the direction a first click sorts
    (``descending``: most first, for what more of is better)."""

    label: str
    field: str
    words: str  # what the caption says it is sorted by
    descending: bool = False
    numeric: bool = False


COLUMNS = (
    Column("Offer", "id", "offer id"),
    Column("Model", "model", "GPU model"),
    Column("GPUs free", "num_gpus", "free GPUs", descending=True, numeric=True),
    Column("VRAM", "gpu_ram", "GPU memory", descending=True, numeric=True),
    Column("Tier", "tier", "tier"),
    Column("Price / GPU-h", "price", "price", numeric=True),
    Column("Min bid", "min_bid", "minimum bid", numeric=True),
    Column("Reliability", "reliability", "reliability", descending=True, numeric=True),
    Column("Region", "region", "region"),
)
SORTS = {
    "-score": "best value (reliability for the price)",
    "price": "price, lowest first",
    "-reliability": "reliability, highest first",
    "-num_gpus": "free GPUs, most first",
    "-gpu_ram": "GPU memory, most first",
}
# Every sort a column's link can ask for, with words for the caption and the menu.
SORT_LABELS = {
    **{f"{sign}{c.field}": f"{c.words}, {'highest' if sign else 'lowest'} first" for c in COLUMNS for sign in ("", "-")},
    **{f"{sign}{c.field}": f"{c.words}, {'Z to A' if sign else 'A to Z'}" for c in COLUMNS if not c.numeric
       for sign in ("", "-")},
    "score": "best value, lowest first",
    **SORTS,
}  # fmt: skip


def offer_query(form: Any, errors: FormErrors) -> tuple[str, str, str]:
    """(the query the form's fields build, the raw query box, sort) — the raw box first in the full query, so that a
    position the query language reports in it is a position in the box."""
    conditions = []
    for field, label in (("model", "GPU model"), ("tier", "tier"), ("region", "region")):
        value = word(form, field, errors, label=label)
        if value is not None:
            conditions.append(f"{field}={value}")
    gpus = integer(form, "gpus", errors, label="GPUs", low=1, high=MAX_GPUS_PER_REPLICA)
    if gpus is not None:
        conditions.append(f"num_gpus>={gpus}")
    max_price = amount(form, "max_price", errors, label="max price")
    if max_price is not None:
        conditions.append(f"price<={max_price}")
    reliability = number(form, "min_reliability", errors, label="min reliability", low=0, high=1)
    if reliability is not None:
        conditions.append(f"reliability>={reliability:g}")
    sort = text(form, "sort")
    if sort and sort not in SORT_LABELS:
        errors.add("sort", f"sort: one of {', '.join(SORTS)}, or a column's field with - for descending (not {sort[:40]!r})")
        sort = ""
    return " ".join(conditions), text(form, "q", max_length=2000), sort


@dataclass(frozen=True)
class Heading:
    column: Column
    url: str  # sorts by this column (the other direction when it is the sort now), first page, filters kept
    aria_sort: str  # "ascending" | "descending" | "none"
    next_direction: str  # for the link's label: what a click does


def headings(request: web.Request, applied: str) -> list[Heading]:
    """Each column's heading: a link that sorts by it, keeping the filters and dropping the cursor."""
    kept = {k: v for k, v in request.query.items() if k not in ("cursor", "sort")}
    shown = []
    for column in COLUMNS:
        if applied == column.field:
            state, target = "ascending", f"-{column.field}"
        elif applied == f"-{column.field}":
            state, target = "descending", column.field
        else:
            state, target = "none", f"-{column.field}" if column.descending else column.field
        url = str(request.rel_url.with_query({**kept, "sort": target}))
        shown.append(Heading(column, url, state, "descending" if target.startswith("-") else "ascending"))
    return shown


def _menu(values: list[str], chosen: str) -> list[str]:
    """A menu's values: what is offered now, and what the form names even when no longer offered (kept selected)."""
    return values if not chosen or chosen in values else [*values, chosen]


async def offers(request: web.Request) -> web.Response:
    await session.signed_in(request, Resource.OFFERS, Action.READ)
    market = request.app[SERVICES_KEY].market
    form = request.query
    errors = FormErrors()
    built, raw, sort = offer_query(form, errors)
    query = f"{raw} {built}".strip()
    result = None
    marked: tuple[str, str] | None = None  # the query box's text before the trouble, and the trouble
    marked_after = ""
    cursor = text(form, "cursor", max_length=1024) or None
    if not errors:
        try:
            result = await market.search_offers(query, sort=sort or None, limit=OFFERS_PER_PAGE, cursor=cursor)
        except BadQuery as exc:
            errors.add("q", str(exc))
            if exc.position < len(raw):  # in the box (the form's own conditions come after it)
                marked = (raw[: exc.position], raw[exc.position : exc.position + max(1, len(exc.token))])
                marked_after = raw[exc.position + len(marked[1]) :]
    next_url = None
    if result is not None and result.next_cursor:
        next_url = request.rel_url.update_query(cursor=result.next_cursor)
    choices = await market.offer_choices()
    menus = {
        "model": _menu(choices.models, text(form, "model")),
        "tier": _menu(choices.tiers, text(form, "tier")),
        "region": _menu(choices.regions, text(form, "region")),
    }
    status = 400 if errors else 200
    return await page(
        request, "renter/offers.html", status=status, title="Offers", form=form, errors=errors, query=query,
        raw=raw, sorts=SORTS, sort_labels=SORT_LABELS, result=result, next_url=next_url, money=format_amount,
        first_page=cursor is None, menus=menus,
        headings=headings(request, result.sort if result is not None else sort or "-score"),
        first_url=request.rel_url.with_query({k: v for k, v in request.query.items() if k != "cursor"}),
        marked=marked, marked_after=marked_after,
    )  # fmt: skip


# --- one offer ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanBar:
    """One span of the availability bar, as a share of its width (percent)."""

    left: float
    width: float
    state: str
    offering: bool
    start: float
    end: float


def availability_bar(spans: list[StateSpan]) -> list[SpanBar]:
    """The window's spans as segments of a bar drawn in HTML (no script, no chart library)."""
    if not spans:
        return []
    first, total = spans[0].start, spans[-1].end - spans[0].start
    if total <= 0:
        return []
    return [
        SpanBar(
            left=round(100 * (s.start - first) / total, 3),
            width=max(round(100 * (s.end - s.start) / total, 3), 0.2),
            state=s.state,
            offering=s.offering,
            start=s.start,
            end=s.end,
        )
        for s in spans
    ]


async def offer_page(request: web.Request) -> web.Response:
    await session.signed_in(request, Resource.OFFERS, Action.READ)
    detail = await request.app[SERVICES_KEY].market.offer_detail(request.match_info["offer_id"])
    offer = detail.offer
    return await page(
        request, "renter/offer.html", title=f"{offer.model} on {offer.host}", d=detail, o=offer,
        money=format_amount, bar=availability_bar(detail.spans),
    )  # fmt: skip


NAV = [NavItem("renter", "Offers", "/console/offers", order=10)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/offers", offers)
    router.add_get("/console/offers/{offer_id}", offer_page)
