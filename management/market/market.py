"""The market of one Master, composed once: providers' prices, the offers derived from them, the ledger, the metering
of rentals, and each host's reliability over the fee window. The façade of operations owns one; the scheduler reads
its prices and who has money (``funded``); docs/market.md tells how the parts fit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from management.market.ledger import LedgerBook
from management.market.metering_loop import MeterLoop, MeterSettings
from management.market.offer_feed import OfferFeed
from management.market.prices import PriceBook
from management.store import ledger_repo, rental_repo
from management.store.rentals import RentalRepo, rental_order
from management.workloads.book import WorkloadBook
from management.workloads.spec import workload_of
from master.port import MasterPort, stop_loop

log = logging.getLogger(__name__)

RELIABILITY_REFRESH_S = 600.0  # the fee window's figures are read again this often
MIN_RENTALS_FOR_RELIABILITY = 3  # fewer rentals in the window say nothing: the standard fee applies
RENTAL_PAGE = 1000


class HostReliability:
    """Each host's reliability over the fee window (``MasterConfig.reliable_window_s``, 30 days by default): the share
    of its rentals that ended in the window without failing through it, and at most its reputation's uptime. A host with
    fewer than ``MIN_RENTALS_FOR_RELIABILITY`` rentals in the window has none (None: the standard fee)."""

    def __init__(
        self, master: MasterPort, rentals: RentalRepo, *, window_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._master = master
        self._rentals = rentals
        self._window_s = window_s
        self._clock = clock
        self._counts: dict[str, tuple[int, int]] = {}  # agent id -> (rentals in the window, failed through the host)

    async def refresh(self) -> None:
        since = self._clock() - self._window_s
        counts: dict[str, list[int]] = {}
        after: str | None = None
        while True:
            page = await self._rentals.list(ended_since=since, after=after, limit=RENTAL_PAGE)
            for rental in page:
                if rental.ended_at is None:
                    continue
                failed_host = rental.host_failure.split(":", 1)[0] if rental.host_failure else ""
                for host in rental.hosts:
                    seen = counts.setdefault(host.agent_id, [0, 0])
                    seen[0] += 1
                    seen[1] += host.agent_id == failed_host
            if len(page) < RENTAL_PAGE:
                break
            after = rental_order(page[-1].started_at, page[-1].id)
        self._counts = {agent: (n, failed) for agent, (n, failed) in counts.items()}

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
        self.offers = OfferFeed(master, prices.price, interruptible=self._interruptible_container)
        prices.subscribe(self.offers.prices_changed)
        self.reliability = HostReliability(master, rental_repo(master.store), window_s=config.reliable_window_s)
        self.meter = MeterLoop(
            master,
            book,
            self.ledger,
            rental_repo(master.store),
            prices.price,
            MeterSettings.of(config),
            reliability=self.reliability,
        )
        self._book = book
        self._loaded = False
        self._task: asyncio.Task[None] | None = None

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
