"""The market of one Master, composed once: providers' prices, the offers derived from them, the ledger, the metering
of rentals, and each host's reliability over the fee window. The façade of operations owns one; the scheduler reads
its prices and who has money (``funded``); docs/market.md tells how the parts fit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from management.market.completion import CompletionPolicy, CompletionRate, completion_rates
from management.market.ledger import LedgerBook
from management.market.metering_loop import MeterLoop, MeterSettings
from management.market.offer_feed import OfferFeed
from management.market.prices import PriceBook
from management.store import ledger_repo, rental_repo
from management.store.rentals import RentalRepo, rental_order
from management.workloads.book import WorkloadBook
from management.workloads.spec import workload_of
from master.port import MasterPort, RentalRecord, stop_loop

log = logging.getLogger(__name__)

RELIABILITY_REFRESH_S = 600.0  # the fee window's figures are read again this often
MIN_RENTALS_FOR_RELIABILITY = 3  # fewer rentals in the window say nothing: the standard fee applies
RENTAL_PAGE = 1000
REVIEW_EVENT = "market.completion_reviewed"  # an operator reviewed a host under review: its count starts afresh
EVENT_PAGE = 500


class HostReliability:
    """Each host's reliability over the fee window (``MasterConfig.reliable_window_s``, 30 days by default): the share
    of its rentals that ended in the window without failing through it, and at most its reputation's uptime. A host with
    fewer than ``MIN_RENTALS_FOR_RELIABILITY`` rentals in the window has none (None: the standard fee)."""

    def __init__(
        self,
        master: MasterPort,
        rentals: RentalRepo,
        *,
        window_s: float,
        clock: Callable[[], float] = time.time,
        completion: CompletionPolicy | None = None,
    ) -> None:
        self._master = master
        self._rentals = rentals
        self._window_s = window_s
        self._clock = clock
        self._counts: dict[str, tuple[int, int]] = {}  # agent id -> (rentals in the window, failed through the host)
        self._completion_policy = completion or CompletionPolicy()
        self._completion: dict[str, CompletionRate] = {}
        self.on_change: Callable[[set[str]], None] | None = None  # hosts whose completion rate moved (the offers')

    async def refresh(self) -> None:
        """The window's figures, read again: each host's reliability and its completion rate by close reason."""
        since = self._clock() - self._window_s
        counts: dict[str, list[int]] = {}
        ended: list[RentalRecord] = []
        after: str | None = None
        while True:
            page = await self._rentals.list(ended_since=since, after=after, limit=RENTAL_PAGE)
            for rental in page:
                if rental.ended_at is None:
                    continue
                ended.append(rental)
                failed_host = rental.host_failure.split(":", 1)[0] if rental.host_failure else ""
                for host in rental.hosts:
                    seen = counts.setdefault(host.agent_id, [0, 0])
                    seen[0] += 1
                    seen[1] += host.agent_id == failed_host
            if len(page) < RENTAL_PAGE:
                break
            after = rental_order(page[-1].started_at, page[-1].id)
        self._counts = {agent: (n, failed) for agent, (n, failed) in counts.items()}
        before = self._completion
        self._completion = completion_rates(ended, await self._reviews(), self._completion_policy)
        moved = {a for a in set(before) | set(self._completion) if before.get(a) != self._completion.get(a)}
        if moved and self.on_change is not None:
            self.on_change(moved)

    async def _reviews(self) -> dict[str, float]:
        """Each host's last review by an operator (its ``market.completion_reviewed`` events)."""
        reviews: dict[str, float] = {}
        after = 0
        while True:
            page = await self._master.events_after(kind_prefix=REVIEW_EVENT, after_seq=after, limit=EVENT_PAGE)
            for event in page:
                reviews[event.subject] = max(event.ts, reviews.get(event.subject, 0.0))
            if len(page) < EVENT_PAGE:
                return reviews
            after = page[-1].seq

    def completion(self, agent_id: str) -> CompletionRate:
        """The host's completion rate by close reason over the window (since its last review)."""
        return self._completion.get(agent_id) or CompletionRate(agent_id=agent_id)

    def under_review(self, agent_id: str) -> bool:
        """Whether the host's completion rate is below the policy's threshold: it is not offered until reviewed."""
        found = self._completion.get(agent_id)
        return found is not None and found.under_review

    @property
    def completion_policy(self) -> CompletionPolicy:
        """The threshold and minimum of rentals that put a host under review."""
        return self._completion_policy

    def held_for_review(self) -> list[CompletionRate]:
        """The hosts under review now, the lowest rate first (the operator's review list)."""
        held = [rate for rate in self._completion.values() if rate.under_review]
        return sorted(held, key=lambda rate: (rate.rate if rate.rate is not None else 1.0, rate.agent_id))

    async def review(self, agent_id: str, by: str) -> CompletionRate:
        """An operator reviewed the host: its count starts afresh from now, so it is offered again."""
        before = self.completion(agent_id)
        await self._master.record_event(
            REVIEW_EVENT, agent_id, by=by, rate=before.rate, rentals=before.rentals, by_reason=dict(before.by_reason)
        )
        await self.refresh()
        return self.completion(agent_id)

    def evidence(self, agent_id: str) -> tuple[int, int]:
        """(rentals that ended in the window, of which failed through this host)."""
        return self._counts.get(agent_id, (0, 0))

    def __call__(self, agent_id: str) -> float | None:
        rentals, failed = self.evidence(agent_id)
        if rentals < MIN_RENTALS_FOR_RELIABILITY:
            return None
        share = (rentals - failed) / rentals
        agent = self._master.registry.agents.get(agent_id)
        if agent is not None:
            up, down = agent.uptime_s, agent.downtime_s
            if up + down > 0:
                share = min(share, up / (up + down))
        return share


class Market:
    def __init__(self, master: MasterPort, book: WorkloadBook, prices: PriceBook) -> None:
        config = master.config
        self.prices = prices
        self.ledger = LedgerBook(ledger_repo(master.store))
        self.offers = OfferFeed(master, prices.price, interruptible=self._interruptible_container, completion=self._completion)
        prices.subscribe(self.offers.prices_changed)
        completion = CompletionPolicy(threshold=config.completion_rate_threshold, min_rentals=config.completion_min_rentals)
        self.reliability = HostReliability(
            master, rental_repo(master.store), window_s=config.reliable_window_s, completion=completion
        )
        self.meter = MeterLoop(
            master,
            book,
            self.ledger,
            rental_repo(master.store),
            prices.price,
            MeterSettings.of(config),
            reliability=self.reliability,
        )
        self.reliability.on_change = self.offers.hosts_changed
        self._book = book
        self._loaded = False
        self._task: asyncio.Task[None] | None = None

    def _completion(self, agent_id: str) -> CompletionRate:
        return self.reliability.completion(agent_id)

    def _interruptible_container(self, container: str) -> bool:
        """Whether ``container`` belongs to an open interruptible workload (its GPUs are on offer on demand)."""
        workload_id = workload_of(container)
        rec = self._book.open_workload(workload_id) if workload_id is not None else None
        return rec is not None and rec.spec.rental is not None and rec.spec.rental.kind == "interruptible"

    def funded(self, account: str) -> bool:
        """Whether a renter has money available: the scheduler gives one without only free hosts."""
        return self.ledger.has_funds(account)

    def budget(self, account: str) -> int:
        """A renter's available balance: the scheduler places its work only where it pays one metering period."""
        return self.ledger.funds(account).available

    async def load(self) -> None:
        """Prices, balances, open rentals and the fee window, in memory before the first call (after any restart)."""
        if self._loaded:
            return
        await self.prices.load()
        await self.ledger.load()
        await self._book.load()
        await self.meter.load()
        await self.reliability.refresh()
        self._loaded = True

    def start(self) -> None:
        self.offers.start()
        self.meter.start()
        self._task = asyncio.create_task(self._refresh_reliability(), name="market-reliability")

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None
        await self.meter.stop()
        self.offers.close()

    async def _refresh_reliability(self) -> None:
        while True:
            await asyncio.sleep(RELIABILITY_REFRESH_S)
            try:
                await self.reliability.refresh()
            except Exception:
                log.exception("the hosts' reliability over the fee window was not refreshed; the old figures stay")
