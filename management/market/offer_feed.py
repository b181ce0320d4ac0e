"""Keeps an OfferIndex current for a running Master: a host's offer is re-derived before the next search after
anything it rests on changed, and only then (docs/offers.md, "Freshness").

What marks a host dirty, all from the Master's one change feed (master/changes.py):
- its queue (``changes.subscribe()``): a host's state, a GPU's health, a container's exit, a command's end; a
  ``Resync`` (changes were lost) marks every host;
- synchronously, before the change is acted on (``changes.listen``): ``HoldsChanged`` (a hold taken, confirmed, given
  back, or the holds rebuilt), ``AgentWritten`` (an agent record written: a hello with a new inventory, a drain, an
  undrain) and ``GpusWritten`` (a host's GPU records written, whoever caused it: another host's hello naming its
  uuids withdrew or flagged them: the offer once kept advertising them and a rent of 5 was queued for ever);
- ``prices_changed(provider, agent_id | None)``: a host's price, or its provider's default (every host of it);
- ``hosts_changed(agent_ids)``: hosts whose completion rate moved (a host under review is not offered: docs/disputes.md).
Reputation moves with every heartbeat (uptime) and is not worth a change each time: each host is also re-derived
when its offer is older than ``max_age_s``: at most ``max_aged_per_refresh`` such hosts per search, oldest first, so
a search after a quiet spell does not re-derive the whole grid (about 40 µs a host) before it answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from common.errors import NotFound
from management.market.completion import CompletionRate
from management.market.offers import DEFAULT_LIMIT, Offer, OfferChoices, OfferIndex, SearchResult, offer_choices
from management.market.prices import HostPrice
from management.market.query import Query, SortKey
from master.port import (
    DEFAULT_CAPACITY,
    AgentRecord,
    AgentState,
    AgentWritten,
    Change,
    GpusWritten,
    HoldsChanged,
    MasterPort,
    Resync,
    Subscription,
    reputation_score,
)

log = logging.getLogger(__name__)

BACKGROUND_SLICE = 100  # hosts the background refresh re-derives before it lets the event loop run (about 5 ms)
PriceOf = Callable[[str, str], HostPrice]  # (provider, agent id) -> the price in force: PriceBook.price


class OfferFeed:
    """The offers of one Master's hosts: ``search`` answers from an index that has taken in every change so far.

    Wiring: ``feed = OfferFeed(master, book.price)`` and ``book.subscribe(feed.prices_changed)`` (PriceBook)."""

    def __init__(
        self,
        master: MasterPort,
        price_of: PriceOf,
        *,
        reliability_of: Callable[[AgentRecord], float] = reputation_score,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        changes_capacity: int = DEFAULT_CAPACITY,
        max_aged_per_refresh: int = 200,
        interruptible: Callable[[str], bool] = lambda _container: False,
        completion: Callable[[str], CompletionRate] | None = None,
    ) -> None:
        self.master = master
        self.index = OfferIndex()
        self._price_of = price_of
        self._interruptible = interruptible  # container name -> whether an interruptible rental's container holds it
        self._reliability_of = reliability_of
        self._completion = completion  # agent id -> its completion rate (None: not published, nothing held for review)
        self._max_age_s = max_age_s
        self._max_aged = max_aged_per_refresh
        self._clock = clock
        self._dirty: set[str] = set()
        self._everything_dirty = True  # the first search builds every host's offer
        self._refreshed: OrderedDict[str, float] = OrderedDict()  # host -> when its offer was derived, oldest first
        self._subscription: Subscription | None = master.changes.subscribe(changes_capacity)
        # GpusWritten: also a host's GPUs changed by another host's hello
        self._unlisten = [master.changes.listen(self._on_written, (HoldsChanged, AgentWritten, GpusWritten))]
        self._task: asyncio.Task[None] | None = None

    def start(self, *, refresh_every_s: float = 1.0) -> None:
        """Also refresh in the background, every ``refresh_every_s``: the change feed's queue never overflows while
        nobody searches (a Resync would mean a full rebuild), and a search finds little left to re-derive."""
        if self._task is None:
            self._task = asyncio.create_task(self._refresh_forever(refresh_every_s), name="offer-feed")

    async def _refresh_forever(self, every_s: float) -> None:
        # In slices, yielding between them: a burst of changes (10,000 hellos, a resync) must not hold the Master's
        # event loop, which times every relay link's frames, for the half second a full rebuild of 10,000 offers takes.
        while self._subscription is not None:
            await asyncio.sleep(every_s)
            try:
                while self.refresh(limit=BACKGROUND_SLICE) and (self._dirty or self._everything_dirty):
                    await asyncio.sleep(0)
            except Exception:  # a host whose records break the derivation must not stop the refreshes of the rest
                log.exception("offer feed: background refresh failed; the next search tries again")

    def close(self) -> None:
        """Stop following the Master and refreshing (the index keeps what it has)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        for unlisten in self._unlisten:
            unlisten()
        self._unlisten = []

    def prices_changed(self, provider: str, agent_id: str | None = None) -> None:
        """A price record changed: one host's (``agent_id``), or the provider's default (None: every host of it)."""
        if agent_id:
            self._dirty.add(agent_id)
        else:
            self._dirty.update(a.id for a in self.master.registry.agents.values() if a.provider == provider)

    def hosts_changed(self, agent_ids: Iterable[str]) -> None:
        """These hosts' completion rates (or review) changed: their offers are derived again before the next search."""
        self._dirty.update(agent_ids)

    def _on_written(self, change: Change) -> None:
        agent_id = getattr(change, "agent_id", None)
        if agent_id is None:  # HoldsChanged(None): the holds were rebuilt, every host's may have changed
            self._everything_dirty = True
        else:
            self._dirty.add(agent_id)

    def _drain_changes(self) -> None:
        subscription = self._subscription
        if subscription is None:
            return
        while (change := subscription.get_nowait()) is not None:
            agent_id = None if isinstance(change, Resync) else change.agent_id
            if agent_id is None:
                self._everything_dirty = True
            else:
                self._dirty.add(agent_id)

    def refresh(self, *, now: float | None = None, limit: int | None = None) -> int:
        """Re-derive the offers of every host changed since the last refresh (at most ``limit`` of them, the rest left
        for the next call), and of up to ``max_aged_per_refresh`` whose offer is older than ``max_age_s`` (oldest
        first) while there is room; returns how many hosts were looked at. A search calls it without a limit, so it
        never answers from a host's offer that a change has made stale."""
        now = self._clock() if now is None else now
        self._drain_changes()
        registry = self.master.registry
        if self._everything_dirty:
            self._everything_dirty = False
            for gone in [h for h in self._refreshed if h not in registry.agents]:
                self._forget(gone)
            self._dirty.update(registry.agents)
        if limit is not None and len(self._dirty) > limit:
            hosts = [self._dirty.pop() for _ in range(limit)]
        else:
            hosts = list(self._dirty)
            self._dirty.clear()
            room = self._max_aged if limit is None else min(self._max_aged, limit - len(hosts))
            stale_before = now - self._max_age_s
            aged = 0
            for host, at in self._refreshed.items():
                if at > stale_before or aged >= room:
                    break
                hosts.append(host)
                aged += 1
        for host in hosts:
            try:
                self._refresh_host(host, now)
            except Exception:  # one host's odd records must not fail every search: it is not offered, and said so
                log.exception("offer feed: could not derive the offer of host %s; it is not offered", host)
                self.index.remove_host(host)
        return len(hosts)

    def _forget(self, host: str) -> None:
        self.index.remove_host(host)
        self._refreshed.pop(host, None)

    def _refresh_host(self, host: str, now: float) -> Offer | None:
        registry = self.master.registry
        agent = registry.agents.get(host)
        if agent is None or agent.state == AgentState.RETIRED.value:
            self._forget(host)
            return None
        gpus = registry.gpus_of(host)
        allocations = self.master.allocations
        held: set[str] = set()
        outbid: set[str] = set()  # held by an interruptible rental: an on-demand one may preempt it
        for gpu in gpus:
            for uuid in (gpu.uuid, *(instance.uuid for instance in gpu.info.mig_instances)):
                hold = allocations.holder(uuid)
                if hold is not None:
                    held.add(uuid)
                    if self._interruptible(hold.container):
                        outbid.add(uuid)
        price = self._price_of(agent.provider, agent.id)
        sandboxed = self.master.config.offer_sandboxed_hosts
        reliability = self._reliability_of(agent)
        completion = self._completion(agent.id) if self._completion is not None else None
        if completion is not None and completion.under_review:  # not offered until an operator reviews it
            self._forget(host)
            return None
        offer = self.index.update_host(
            agent,
            gpus,
            held,
            price,
            reliability,
            allow_sandboxed=sandboxed,
            outbid=outbid,
            completion_rate=completion.rate if completion is not None else None,
        )
        self._refreshed.pop(host, None)
        self._refreshed[host] = now
        return offer

    def offer(self, host_id: str) -> Offer:
        """The offer of one host now; NotFound when it offers nothing (say why: unknown, not taking work, all held)."""
        self.refresh()
        offer = self.index.get(host_id)
        if offer is not None:
            return offer
        agent = self.master.registry.agents.get(host_id)
        if agent is None:
            raise NotFound(f"no offer {host_id!r}: no such host")
        if agent.state not in (AgentState.READY.value, AgentState.BUSY.value) or agent.drained:
            why = "drained" if agent.drained else agent.state
            raise NotFound(f"no offer {host_id!r}: the host is {why} and takes no new work")
        review = self._completion(host_id) if self._completion is not None else None
        if review is not None and review.under_review:
            raise NotFound(
                f"no offer {host_id!r}: the host's rental completion rate ({review.rate:.0%} of {review.rentals}) is under "
                "the grid's threshold; it is offered again once an operator reviews it"
            )
        raise NotFound(f"no offer {host_id!r}: the host has no free healthy GPU it may rent out now")

    def choices(self) -> OfferChoices:
        """The models, tiers and regions offered now (one pass over the index, after taking in every change)."""
        self.refresh()
        return offer_choices(self.index.offers())

    def search(
        self,
        query: Query | str = "",
        sort: SortKey | str | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> SearchResult:
        """``OfferIndex.search`` after taking in every change so far."""
        self.refresh()
        return self.index.search(query, sort, limit, cursor)
