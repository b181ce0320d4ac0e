"""What the relay counts: Prometheus series on a registry of its own, plus the totals it reports to the Master.

One registry per relay instance (not prometheus_client's global one), so several relays can run in one
process, as they do in tests. Every label takes values from a fixed set (frame types, close codes, reasons,
routes): never an agent id or an address, so the series stay few however many agents come and go.

The per-frame counters are the hot path of a relay carrying thousands of agents: a frame's type comes from
the verdict the relay already reached on it (inbound) or from the codec's leading type tag (outbound), and
each type's counter child is looked up once, not per frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from common.wire import (
    CLOSE_FLOOD,
    CLOSE_POLICY,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_SILENT,
    AgentFrame,
    MasterFrame,
)

__all__ = ["CONTENT_TYPE_LATEST", "RelayMetrics"]

OTHER = "other"
# Close codes worth telling apart; any other code a peer sends is counted as "other".
KNOWN_CLOSE_CODES = frozenset(
    {1000, 1001, 1006, 1009, 1011, CLOSE_FLOOD, CLOSE_POLICY, CLOSE_REVOKED, CLOSE_REPLACED, CLOSE_SILENT}
)
# Enrollment and /metrics answer in milliseconds; a speed-test download takes up to tens of seconds.
HTTP_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Outbound frames carry the codec's type tag first: b'{"type":"command",...' (see RENEW_RESPONSE_PREFIX).
_TYPE_TAG = b'{"type":"'
_TYPE_TAG_END = len(_TYPE_TAG) + 32  # longer than any frame type's name


def _tags(union: object) -> list[str]:
    """The type tags of a union of frame classes, as the codec writes them."""
    return [cls.__struct_config__.tag for cls in getattr(union, "__args__", ())]


AGENT_FRAME_TYPES = tuple(_tags(AgentFrame))
MASTER_FRAME_TYPES = tuple(_tags(MasterFrame))  # relay_status, the relay's own frame to its agents, among them


class _PerType:
    """A counter's child per frame type, looked up once; unknown types count as "other"."""

    __slots__ = ("_children", "_by_tag", "_other")

    def __init__(self, counter: Counter, relay_id: str, types: Iterable[str]) -> None:
        self._children = {kind: counter.labels(relay=relay_id, type=kind) for kind in types}
        self._by_tag = {kind.encode(): child for kind, child in self._children.items()}
        self._other = counter.labels(relay=relay_id, type=OTHER)

    def count(self, kind: str) -> None:
        self._children.get(kind, self._other).inc()

    def count_tag(self, tag: bytes) -> None:
        self._by_tag.get(tag, self._other).inc()


class RelayMetrics:
    def __init__(self, relay_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # CPU seconds, resident memory, open descriptors of this process
        self._relay_id = relay_id
        labels = {"relay": relay_id}
        r = self.registry
        self.agents = Gauge("idlegrid_access_agents_connected", "Agents connected to this relay", ["relay"], registry=r).labels(
            **labels
        )
        frames_in = Counter(
            "idlegrid_access_frames_in", "Agent frames accepted and queued for the Master, by type", ["relay", "type"], registry=r
        )
        frames_out = Counter(
            "idlegrid_access_frames_out",
            "Frames delivered to agents (the Master's and the relay's own), by type",
            ["relay", "type"],
            registry=r,
        )
        self._frames_in = _PerType(frames_in, relay_id, AGENT_FRAME_TYPES)
        self._frames_out = _PerType(frames_out, relay_id, MASTER_FRAME_TYPES)
        self._frame_errors = Counter(
            "idlegrid_access_frame_errors", "Agent frames answered with an error frame, by code", ["relay", "code"], registry=r
        )
        # reasons: at accept ip_connections, ip_rate, openings_full; opening slow_opening, busy (503),
        # admission (503: over the Master's admission rate), reconnect_rate (429), tunnel_rate (429, tunnel connections),
        # bad_certificate, wrong_role, revoked, expired; in session flood, silent, no_pong, too_slow, revoked, expired
        self._refused = Counter(
            "idlegrid_access_connections_refused",
            "Agent connections refused or cut off, by reason",
            ["relay", "reason"],
            registry=r,
        )
        self._opened = Counter(
            "idlegrid_access_connections_opened", "Agent sessions admitted (certificate accepted)", ["relay"], registry=r
        ).labels(**labels)
        self._closed = Counter(
            "idlegrid_access_connections_closed",
            "Agent sessions ended, by WebSocket close code (1006: lost without a close)",
            ["relay", "code"],
            registry=r,
        )
        self._dropped = Counter(
            "idlegrid_access_frames_dropped",
            "Frames not delivered: superseded heartbeats/telemetry, or no such agent here",
            ["relay", "reason"],
            registry=r,
        )
        self._enrollments = Counter(
            "idlegrid_access_enrollments", "Enrollment requests relayed, by outcome", ["relay", "outcome"], registry=r
        )
        self.buffered = Gauge(
            "idlegrid_access_buffered_frames", "Agent frames waiting to go to the Master", ["relay"], registry=r
        ).labels(**labels)
        self.telemetry_buffered = Gauge(
            "idlegrid_access_telemetry_buffered_bytes",
            "Bytes of heartbeats and telemetry waiting to go to the Master (behind every control frame)",
            ["relay"],
            registry=r,
        ).labels(**labels)
        self.report_pace = Gauge(
            "idlegrid_access_report_pace_factor",
            "How many times the configured telemetry interval the Master last told agents here to report at (1: normal)",
            ["relay"],
            registry=r,
        ).labels(**labels)
        self.openings = Gauge(
            "idlegrid_access_openings",
            "Agent connections between TCP accept and WebSocket open (TLS or upgrade in progress)",
            ["relay"],
            registry=r,
        ).labels(**labels)
        self.master_link_up = Gauge(
            "idlegrid_access_master_link_up", "1 while the link to the Master is up", ["relay"], registry=r
        ).labels(**labels)
        self._link_dials = Counter(
            "idlegrid_access_master_link_dials",
            "Attempts to open the link to the Master, by outcome (up, failed); more than one up means reconnects",
            ["relay", "outcome"],
            registry=r,
        )
        self._speedtest_bytes = Counter(
            "idlegrid_access_speedtest_bytes", "Speed-test bytes moved, by direction", ["relay", "direction"], registry=r
        )
        self._speedtest_refused = Counter(
            "idlegrid_access_speedtest_refused",
            "Speed-test transfers refused, by limit (transfers at once, bytes per window, too_large)",
            ["relay", "reason"],
            registry=r,
        )
        self._http_requests = Counter(
            "idlegrid_access_http_requests",
            "HTTPS requests, by route, method and status",
            ["relay", "route", "method", "status"],
            registry=r,
        )
        self._http_seconds = Histogram(
            "idlegrid_access_http_request_duration_seconds",
            "Time from a request reaching the relay to its handler's end, by route",
            ["relay", "route"],
            buckets=HTTP_SECONDS_BUCKETS,
            registry=r,
        )
        self._link_messages = Counter(
            "idlegrid_access_master_link_messages",
            "WebSocket messages sent to the Master; frames per message is link_frames / link_messages",
            ["relay"],
            registry=r,
        ).labels(**labels)
        self._link_frames = Counter(
            "idlegrid_access_master_link_frames", "Frames sent to the Master, batched or not", ["relay"], registry=r
        ).labels(**labels)
        self._folds = Counter(
            "idlegrid_access_report_folds", "Report folds sent toward the Master (access/fold.py)", ["relay"], registry=r
        ).labels(**labels)
        self._folded_agents = Counter(
            "idlegrid_access_report_fold_agents",
            "Agents named in report folds, in all: divided by the folds, agents per fold",
            ["relay"],
            registry=r,
        ).labels(**labels)
        self._http_head_timeouts = Counter(
            "idlegrid_access_http_head_timeouts",
            "HTTPS connections cut off (408) for not sending a request head in time",
            ["relay"],
            registry=r,
        ).labels(**labels)
        # Renters' tunnels (access/tunnels.py). Reasons: ticket, wrong_agent, used, over (the tunnel is over already),
        # relay_limit, agent_limit, certificate; unmet and bad_frame end a tunnel that was let in.
        self.tunnels_open = Gauge(
            "idlegrid_access_tunnels_open", "Tunnels open: waiting for their other end or joined", ["relay"], registry=r
        ).labels(**labels)
        self._tunnels_opened = Counter(
            "idlegrid_access_tunnels_opened", "Tunnels joined (both ends arrived), by kind", ["relay", "kind"], registry=r
        )
        self._tunnels_refused = Counter(
            "idlegrid_access_tunnels_refused",
            "Tunnel ends refused or tunnels cut short, by reason",
            ["relay", "reason"],
            registry=r,
        )
        self._tunnel_bytes = Counter(
            "idlegrid_access_tunnel_bytes",
            "Bytes relayed through tunnels (whole messages), by direction: to_agent, to_renter",
            ["relay", "direction"],
            registry=r,
        )
        self.tunnel_bytes_to_agent = self._tunnel_bytes.labels(relay=relay_id, direction="to_agent")
        self.tunnel_bytes_to_renter = self._tunnel_bytes.labels(relay=relay_id, direction="to_renter")
        for outcome in ("up", "failed"):  # present from the start, so a rate() over them needs no first event
            self._link_dials.labels(relay=relay_id, outcome=outcome)
        for direction in ("download", "upload"):
            self._speedtest_bytes.labels(relay=relay_id, direction=direction)
        # Plain totals for the AccessStats frame: cheaper to read than Prometheus samples.
        self.frames_in = 0
        self.frames_out = 0
        self.refused = 0

    # --- frames (the hot path) ---

    def frame_in(self, kind: str) -> None:
        """An agent frame of type ``kind`` (from the relay's verdict on it) went to the Master's queue."""
        self.frames_in += 1
        self._frames_in.count(kind)

    def frame_out(self, frame: bytes) -> None:
        """A frame went to an agent; its type is read off the codec's leading tag, not decoded."""
        self.frames_out += 1
        start = len(_TYPE_TAG)
        end = frame.find(b'"', start, _TYPE_TAG_END) if frame.startswith(_TYPE_TAG) else -1
        self._frames_out.count_tag(frame[start:end] if end > 0 else b"")

    def link_message(self, frames: int) -> None:
        """One message of ``frames`` frames went to the Master."""
        self._link_messages.inc()
        self._link_frames.inc(frames)

    def fold_sent(self, agents: int) -> None:
        """One report fold naming ``agents`` agents went into the buffer for the Master."""
        self._folds.inc()
        self._folded_agents.inc(agents)

    def frame_error(self, code: str) -> None:
        self._frame_errors.labels(relay=self._relay_id, code=code).inc()

    def drop(self, reason: str, count: int = 1) -> None:
        self._dropped.labels(relay=self._relay_id, reason=reason).inc(count)

    # --- connections ---

    def refuse(self, reason: str) -> None:
        self.refused += 1
        self._refused.labels(relay=self._relay_id, reason=reason).inc()

    def session_opened(self) -> None:
        self._opened.inc()

    def session_closed(self, code: int | None) -> None:
        label = str(code) if code in KNOWN_CLOSE_CODES else ("1006" if code is None else OTHER)
        self._closed.labels(relay=self._relay_id, code=label).inc()

    def link_dial(self, outcome: str) -> None:
        self._link_dials.labels(relay=self._relay_id, outcome=outcome).inc()

    # --- the HTTPS endpoint ---

    def enrollment(self, outcome: str) -> None:
        self._enrollments.labels(relay=self._relay_id, outcome=outcome).inc()

    def speedtest_bytes(self, direction: str, count: int) -> None:
        self._speedtest_bytes.labels(relay=self._relay_id, direction=direction).inc(count)

    def speedtest_refused(self, reason: str) -> None:
        self._speedtest_refused.labels(relay=self._relay_id, reason=reason).inc()

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        # method: bounded by common.http.timed_requests (unknown methods come as "other")
        self._http_requests.labels(relay=self._relay_id, route=route, method=method, status=str(status)).inc()
        self._http_seconds.labels(relay=self._relay_id, route=route).observe(seconds)

    def http_head_timeout(self) -> None:
        self._http_head_timeouts.inc()

    # --- tunnels ---

    def tunnel_opened(self, kind: str) -> None:
        self._tunnels_opened.labels(relay=self._relay_id, kind=kind).inc()

    def tunnel_refused(self, reason: str) -> None:
        self._tunnels_refused.labels(relay=self._relay_id, reason=reason).inc()

    # --- gauges read when scraped ---

    def track_buffer(self, size: Callable[[], int], telemetry_bytes: Callable[[], int] | None = None) -> None:
        self.buffered.set_function(lambda: float(size()))
        if telemetry_bytes is not None:
            self.telemetry_buffered.set_function(lambda: float(telemetry_bytes()))

    def track_openings(self, count: Callable[[], int]) -> None:
        self.openings.set_function(lambda: float(count()))

    def track_tunnels(self, count: Callable[[], int]) -> None:
        self.tunnels_open.set_function(lambda: float(count()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
