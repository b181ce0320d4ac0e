"""What the relay counts: Prometheus series on a registry of its own, plus the totals it reports to the Master.

One registry per relay instance (not prometheus_client's global one), so several relays can run in one
process, as they do in tests.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "RelayMetrics"]


class RelayMetrics:
    def __init__(self, relay_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"relay": relay_id}
        self.agents = Gauge(
            "idlegrid_access_agents_connected", "Agents connected to this relay", registry=self.registry, labelnames=["relay"]
        ).labels(**labels)
        self._frames_in = Counter(
            "idlegrid_access_frames_in",
            "Agent frames accepted and forwarded to the Master",
            registry=self.registry,
            labelnames=["relay"],
        ).labels(**labels)
        self._frames_out = Counter(
            "idlegrid_access_frames_out", "Master frames delivered to agents", registry=self.registry, labelnames=["relay"]
        ).labels(**labels)
        self._frame_errors = Counter(
            "idlegrid_access_frame_errors",
            "Agent frames answered with an error frame, by code",
            registry=self.registry,
            labelnames=["relay", "code"],
        )
        # reasons: at accept ip_connections, ip_rate, openings_full; opening slow_opening, busy (503), reconnect_rate
        # (429), bad_certificate, wrong_role, revoked, expired; in session flood, silent, too_slow, revoked, expired
        self._refused = Counter(
            "idlegrid_access_connections_refused",
            "Agent connections refused or cut off, by reason",
            registry=self.registry,
            labelnames=["relay", "reason"],
        )
        self._dropped = Counter(
            "idlegrid_access_frames_dropped",
            "Frames not delivered: superseded heartbeats/telemetry, or no such agent here",
            registry=self.registry,
            labelnames=["relay", "reason"],
        )
        self._enrollments = Counter(
            "idlegrid_access_enrollments",
            "Enrollment requests, by outcome",
            registry=self.registry,
            labelnames=["relay", "outcome"],
        )
        self.buffered = Gauge(
            "idlegrid_access_buffered_frames",
            "Agent frames waiting to go to the Master",
            registry=self.registry,
            labelnames=["relay"],
        ).labels(**labels)
        self.openings = Gauge(
            "idlegrid_access_openings",
            "Agent connections between TCP accept and WebSocket open (TLS or upgrade in progress)",
            registry=self.registry,
            labelnames=["relay"],
        ).labels(**labels)
        self.master_link_up = Gauge(
            "idlegrid_access_master_link_up", "1 while the link to the Master is up", registry=self.registry, labelnames=["relay"]
        ).labels(**labels)
        self._relay_id = relay_id
        # Plain totals for the AccessStats frame: cheaper to read than Prometheus samples.
        self.frames_in = 0
        self.frames_out = 0
        self.refused = 0

    def frame_in(self) -> None:
        self.frames_in += 1
        self._frames_in.inc()

    def frame_out(self) -> None:
        self.frames_out += 1
        self._frames_out.inc()

    def frame_error(self, code: str) -> None:
        self._frame_errors.labels(relay=self._relay_id, code=code).inc()

    def refuse(self, reason: str) -> None:
        self.refused += 1
        self._refused.labels(relay=self._relay_id, reason=reason).inc()

    def drop(self, reason: str, count: int = 1) -> None:
        self._dropped.labels(relay=self._relay_id, reason=reason).inc(count)

    def enrollment(self, outcome: str) -> None:
        self._enrollments.labels(relay=self._relay_id, outcome=outcome).inc()

    def track_buffer(self, size: Callable[[], int]) -> None:
        self.buffered.set_function(lambda: float(size()))

    def track_openings(self, count: Callable[[], int]) -> None:
        self.openings.set_function(lambda: float(count()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
