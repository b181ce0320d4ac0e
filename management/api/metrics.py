"""Prometheus metrics of the API: requests by route pattern and status, and their latency.

They go into the registry the Master's ``/metrics`` serves (``master.metrics.registry``), beside the
Master's own series: the fleet gauges, frames, commands, enrollments, the store's write latency.
"""

from __future__ import annotations

from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as RequestCounter

from common.http import timed_requests

# Buckets for calls that are answered from memory (a page of GPUs, an agent) up to those that write the store.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Histogram(
            "idlegrid_api_request_seconds",
            "API requests by method, route pattern and status, and how long they took",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.responses = RequestCounter(
            "idlegrid_api_requests",
            "API requests by method, route pattern and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Histogram, RequestCounter]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        if (children := self._children.get(key)) is None:
            # labels() takes the metric's lock and builds its key at every call: once per method, route and status
            # (bounded: the methods known, the route patterns, the statuses) is enough, the children never change
            labels = (method, route, str(status))
            children = self._children[key] = (self.requests.labels(*labels), self.responses.labels(*labels))
        latency, count = children
        latency.observe(seconds)
        count.inc()

    def middleware(self) -> Middleware:
        return timed_requests(self.observe)
