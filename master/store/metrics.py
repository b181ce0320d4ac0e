"""The store's Prometheus metrics: write latency and quarantined records, by aggregate and backend.

Both label sets are bounded: aggregates are the ``Aggregate`` members and the plugged aggregates' names (each given
once, in code: master/store/plugin.py), backends "sqlite" and "mongodb".
The collectors belong to no registry until ``register`` puts them in the daemon's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from master.store.aggregates import Aggregate
from master.store.quarantine import Quarantine

# From a quarter millisecond (one SQLite row, WAL, no fsync) to seconds (a large batch on a loaded replica set).
WRITE_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StoreMetrics:
    def __init__(self, backend: str, quarantine: Quarantine) -> None:
        self.backend = backend
        self.write_seconds = Histogram(
            "idlegrid_store_write_seconds",
            "Time one store write took (a record, or a batch in one round trip), by aggregate and backend",
            ["aggregate", "backend"],
            buckets=WRITE_BUCKETS_S,
            registry=None,
        )
        self.aggregates: list[str] = []
        self.quarantined = _QuarantinedRecords(quarantine, self.aggregates)
        for aggregate in Aggregate:  # every series exists from the start, at zero
            self.track(aggregate)

    def track(self, aggregate: str) -> None:
        """Give ``aggregate``'s series, at zero: the store's own at once, a plugged one's when it is first used."""
        self.write_seconds.labels(aggregate, self.backend)
        self.aggregates.append(aggregate)

    def register(self, registry: CollectorRegistry) -> None:
        """Expose these metrics in ``registry`` (the daemon's, e.g. the Master's ``/metrics``); once per registry."""
        registry.register(self.write_seconds)
        registry.register(self.quarantined)

    @contextmanager
    def timed_write(self, aggregate: str) -> Iterator[None]:
        """Observe the time the block takes as one write of ``aggregate``, whether it succeeds or fails."""
        with self.write_seconds.labels(aggregate, self.backend).time():
            yield


class _QuarantinedRecords(Collector):
    """A gauge read from the quarantine at scrape time."""

    def __init__(self, quarantine: Quarantine, aggregates: list[str]) -> None:
        self._quarantine = quarantine
        self._aggregates = aggregates  # StoreMetrics's, growing as plugged aggregates are used

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "idlegrid_store_quarantined_records",
            "Stored records that failed to decode and are skipped (left in the database), by aggregate and backend",
            labels=["aggregate", "backend"],
        )
        counts = self._quarantine.counts()
        for aggregate in list(self._aggregates):
            gauge.add_metric([aggregate, self._quarantine.backend], counts[aggregate])
        yield gauge
