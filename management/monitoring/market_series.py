"""The market's Prometheus series, counted when scraped from what the management side holds in memory: open
workloads by state (the workload book), open rentals by kind (the meter) and the ledger's balances summed by kind
of ledger account (the ledger book's balances). Labels are bounded sets (workload states, rental kinds, ledger
account kinds), never workload, rental or account ids.

They go into the registry the Master's ``/metrics`` serves, beside the fleet's series (master/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from management.market.money import MICRO
from management.workloads.states import WorkloadState
from master.port import RENTAL_KINDS, RentalRecord

# States a workload leaves the book in: it holds only open ones, so these are always 0 and not exported.
_FINAL = frozenset({str(WorkloadState.SUCCEEDED), str(WorkloadState.FAILED), str(WorkloadState.CANCELLED)})
OPEN_WORKLOAD_STATES = tuple(str(state) for state in WorkloadState if state not in _FINAL)
# Kinds of ledger account (the part of a ledger account's name before its colon, management/market/ledger.py):
# renters' available money, money held for running rentals, providers' earnings, the platform's fees, and the outside
# world (credits come from it: its balance is minus what was paid in).
LEDGER_KINDS = ("renter", "hold", "provider", "platform", "external")


class MarketSeries(Collector):
    """``idlegrid_workloads{state}``, ``idlegrid_rentals_open{kind}`` and ``idlegrid_ledger_balance{kind,currency}``:
    a dictionary of counts and one pass over the open rentals and the ledger's balances (one per account, in memory),
    nothing from the store."""

    def __init__(
        self,
        workloads_by_state: Callable[[], Mapping[str, int]],
        open_rentals: Callable[[], Iterable[RentalRecord]],
        ledger_balances: Callable[[], Mapping[str, int]] = dict,
        *,
        currency: str = "USD",
    ) -> None:
        self._workloads_by_state = workloads_by_state
        self._open_rentals = open_rentals
        self._ledger_balances = ledger_balances
        self._currency = currency

    def collect(self) -> Iterator[GaugeMetricFamily]:
        workloads = GaugeMetricFamily("idlegrid_workloads", "Open workloads by state", labels=["state"])
        counts = dict.fromkeys(OPEN_WORKLOAD_STATES, 0)
        counts.update(self._workloads_by_state())
        for state, n in counts.items():
            workloads.add_metric([state], n)
        yield workloads

        rentals = GaugeMetricFamily("idlegrid_rentals_open", "Rentals running (being charged), by kind", labels=["kind"])
        by_kind = dict.fromkeys(RENTAL_KINDS, 0)
        for rental in self._open_rentals():
            by_kind[rental.kind] = by_kind.get(rental.kind, 0) + 1
        for kind, n in by_kind.items():
            rentals.add_metric([kind], n)
        yield rentals

        ledger = GaugeMetricFamily(
            "idlegrid_ledger_balance",
            "Ledger balances summed by kind of account (renter, hold, provider, platform, external), in currency units",
            labels=["kind", "currency"],
        )
        by_account_kind = dict.fromkeys(LEDGER_KINDS, 0)
        for account, micro in self._ledger_balances().items():
            kind = account.partition(":")[0]
            if kind in by_account_kind:
                by_account_kind[kind] += micro
        for kind, micro in by_account_kind.items():
            ledger.add_metric([kind, self._currency], micro / MICRO)
        yield ledger
