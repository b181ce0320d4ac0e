"""The Access relay's settings: defaults for a local run, then a TOML file, ``IDLEGRID_ACCESS_*`` variables, flags."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from access.speedtest import MAX_IMAGE_SIDE, image_bytes
from common.config import load_config
from common.wire import HARD_FRAME_BYTES, MAX_FRAME_BYTES

ENV_PREFIX = "IDLEGRID_ACCESS_"


class AccessConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    relay_id: str = "relay-1"
    region: str = "local"
    master_url: str = "wss://127.0.0.1:7100/link"
    # Every Master of a highly available pair or more (docs/ha.md); the relay links to the leader, following a standby's
    # refusal to the leader it names. Empty: master_url alone.
    master_urls: list[str] = msgspec.field(default_factory=list)
    public_url: str = ""  # wss:// URL agents reach this relay at, announced to the Master; agent_url when empty
    agent_host: str = "127.0.0.1"
    agent_port: int = 7200  # wss, mutual TLS: agents present their certificate
    http_host: str = "127.0.0.1"
    http_port: int = 7201  # HTTPS, server-auth only: enrollment, speed test, /healthz, /metrics, renters' tunnels
    http_public_url: str = ""  # https:// URL renters reach the HTTPS port at, announced to the Master; bind address when empty
    cert_file: str = ".idlegrid/relay/relay-1.crt"  # role ``access``
    key_file: str = ".idlegrid/relay/relay-1.key"
    ca_file: str = ".idlegrid/relay/ca.crt"
    max_frame_bytes: int = MAX_FRAME_BYTES
    rate_per_agent: float = 50.0  # frames per second, sustained
    burst: int = 200  # frames an agent may send at once before the rate applies
    # An endpoint's workers' calls (``worker_call``: takes, reports, heartbeats; docs/endpoints.md) have a budget of
    # their own per agent, sized for a host serving 1,000 requests a second and more: a busy endpoint's calls neither
    # spend the host's frame budget above nor are dropped by it (a dropped call waits out its answer margin, 15 s).
    worker_call_rate_per_agent: float = 4000.0
    worker_call_burst: int = 8000
    buffer_frames: int = 10_000  # agent frames held while the Master is unreachable
    # Heartbeats and telemetry wait behind control frames, at most this many bytes; past the coalescing bound
    # (and always while the Master is unreachable) only each agent's latest waits (docs/access.md, "Lanes").
    telemetry_buffer_bytes: int = 4 * 1024 * 1024
    telemetry_coalesce_bytes: int = 512 * 1024
    flood_limit: int = 1000  # frames over the rate (refilled at rate_per_agent/s) before an agent is cut off (1008)
    max_handshakes: int = 256  # concurrent TLS/WebSocket openings; more get 503 until some finish
    retry_after_s: float = 5.0  # a refused opening is told to come back after this, jittered up to twice as long
    handshake_timeout_s: float = 10.0  # the whole opening, TCP accept to WebSocket open: TLS and upgrade together
    idle_timeout_s: float = 60.0  # a silent agent is pinged; one that does not answer in time is dropped
    max_silence_s: float = 120.0  # an agent that sends no frame this long is dropped, pongs or not (heartbeats: ~5 s)
    max_connections_per_ip: int = 256  # TCP connections one client address holds at once; NATed providers share one
    connect_rate_per_ip: float = 20.0  # new TCP connections per second per client address, sustained ...
    connect_burst_per_ip: int = 200  # ... after this many at once; over either limit the connection is reset at accept
    reconnect_rate_per_agent: float = 0.2  # WebSocket openings per second per certificate's agent, sustained ...
    reconnect_burst_per_agent: int = 10  # ... after this many; over it the opening gets 429 with Retry-After
    stats_interval_s: float = 10.0
    backoff_initial_s: float = 0.5  # reconnecting to the Master: capped exponential backoff, full jitter
    backoff_max_s: float = 30.0
    enroll_timeout_s: float = 15.0
    enroll_rate_per_ip: float = 1.0  # enrollment requests per second per client address
    enroll_burst: int = 10
    max_body_bytes: int = 64 * 1024
    # Request heads (line and headers) on the HTTPS endpoint must arrive this soon after the connection opens
    # (or, on a kept-alive connection, after their first byte); a client trickling them is cut off with 408.
    http_head_timeout_s: float = 5.0
    # The speed test, per client address: transfers at once (speedtest-cli runs 2 to 8 threads) ...
    speedtest_transfers_per_ip: int = 8
    # ... and bytes moved, refilled evenly over the window: a whole default measurement (about 470 MB, 413 MB of
    # it downloads) fits twice; a client looping on the largest image is stopped within seconds.
    speedtest_bytes_per_window: int = 1024 * 1024 * 1024
    speedtest_window_s: float = 3600.0
    # Frames to the Master go several to a WebSocket message (a JSON array) when the Master takes batches: at most
    # this many frames and bytes in one, and under load at most one message per window (an idle link sends at once).
    # 1 sends every frame on its own.
    link_batch_frames: int = 256
    link_batch_bytes: int = 1024 * 1024
    link_batch_window_s: float = 0.01
    # Folding (access/fold.py): agents' heartbeats and telemetry go to a Master that takes folds as one report_fold
    # per interval; 0 turns folding off (every frame on its own). A fold holding fold_max_samples samples (or
    # link_batch_bytes of frames) goes at once, before its interval ends.
    fold_interval_s: float = 1.0
    fold_max_samples: int = 4096
    # Renters' tunnels (access/tunnels.py): bytes per second each way per tunnel when its ticket names no rate,
    # tunnels open (waiting for their other end or joined) on this relay and per agent, and how long past its
    # ticket's expiry an end waits for the other before it is closed (4021).
    tunnel_bytes_per_s: int = 32 * 1024 * 1024
    max_tunnels: int = 256
    max_tunnels_per_agent: int = 16
    tunnel_grace_s: float = 5.0
    # Tunnel connections an agent's certificate may open on the agent port, per second sustained and at once
    # (the control connection's reconnect limit does not apply to them); over it: 429 with Retry-After.
    tunnel_open_rate_per_agent: float = 5.0
    tunnel_open_burst_per_agent: int = 32
    drain_timeout_s: float = 3.0  # on stop: how long to keep flushing buffered frames to the Master
    log_level: str = "info"

    def __post_init__(self) -> None:
        _check(self)

    @property
    def masters(self) -> list[str]:
        """The Masters' link URLs to dial, in order: ``master_urls``, or ``master_url`` alone."""
        return list(self.master_urls) or [self.master_url]


def _check(config: AccessConfig) -> None:
    """Reject values that would make the relay misbehave, with a message naming the setting."""
    problems: list[str] = []
    if not config.relay_id:
        problems.append("relay_id must not be empty")
    if not config.master_url.startswith(("wss://", "ws://")):
        problems.append(f"master_url must be a wss:// URL, got {config.master_url!r}")
    for url in config.master_urls:
        if not url.startswith(("wss://", "ws://")):
            problems.append(f"master_urls must hold wss:// URLs, got {url!r}")
    for name in ("agent_port", "http_port"):
        port = getattr(config, name)
        if not 0 <= port <= 65535:
            problems.append(f"{name} must be between 0 and 65535, got {port}")
    if not 0 < config.max_frame_bytes <= HARD_FRAME_BYTES:
        problems.append(f"max_frame_bytes must be between 1 and {HARD_FRAME_BYTES}, got {config.max_frame_bytes}")
    for name in (
        "rate_per_agent",
        "worker_call_rate_per_agent",
        "handshake_timeout_s",
        "idle_timeout_s",
        "stats_interval_s",
        "backoff_initial_s",
        "backoff_max_s",
        "enroll_timeout_s",
        "enroll_rate_per_ip",
        "retry_after_s",
        "max_silence_s",
        "connect_rate_per_ip",
        "reconnect_rate_per_agent",
        "http_head_timeout_s",
        "speedtest_window_s",
        "tunnel_open_rate_per_agent",
    ):
        if getattr(config, name) <= 0:
            problems.append(f"{name} must be positive, got {getattr(config, name)}")
    for name in (
        "burst",
        "worker_call_burst",
        "buffer_frames",
        "telemetry_buffer_bytes",
        "max_handshakes",
        "enroll_burst",
        "max_body_bytes",
        "flood_limit",
        "max_connections_per_ip",
        "connect_burst_per_ip",
        "reconnect_burst_per_agent",
        "speedtest_transfers_per_ip",
        "link_batch_frames",
        "fold_max_samples",
        "tunnel_bytes_per_s",
        "max_tunnels",
        "max_tunnels_per_agent",
        "tunnel_open_burst_per_agent",
    ):
        if getattr(config, name) < 1:
            problems.append(f"{name} must be at least 1, got {getattr(config, name)}")
    largest = image_bytes(MAX_IMAGE_SIDE)
    if config.speedtest_bytes_per_window < largest:
        problems.append(
            f"speedtest_bytes_per_window must be at least {largest} (the largest speed-test image), "
            f"got {config.speedtest_bytes_per_window}"
        )
    if not MAX_FRAME_BYTES <= config.link_batch_bytes <= HARD_FRAME_BYTES // 2:
        bounds = f"{MAX_FRAME_BYTES} and {HARD_FRAME_BYTES // 2}"
        problems.append(f"link_batch_bytes must be between {bounds}, got {config.link_batch_bytes}")
    if not 0 <= config.link_batch_window_s <= 1:
        problems.append(f"link_batch_window_s must be between 0 and 1, got {config.link_batch_window_s}")
    if not 0 <= config.fold_interval_s <= 10:
        problems.append(f"fold_interval_s must be between 0 (off) and 10, got {config.fold_interval_s}")
    if config.tunnel_grace_s < 0:
        problems.append(f"tunnel_grace_s must not be negative, got {config.tunnel_grace_s}")
    if config.http_public_url and not config.http_public_url.startswith("https://"):
        problems.append(f"http_public_url must be an https:// URL, got {config.http_public_url!r}")
    if config.drain_timeout_s < 0:
        problems.append(f"drain_timeout_s must not be negative, got {config.drain_timeout_s}")
    if problems:
        # msgspec wraps errors raised here in a ValidationError; load_config turns that into a ConfigError.
        raise ValueError("; ".join(problems))


def load_access_config(
    path: Path | None = None, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> AccessConfig:
    """Defaults, then ``path`` (TOML), then ``IDLEGRID_ACCESS_<FIELD>`` variables, then ``overrides`` (flags).

    ``None`` in ``overrides`` means "flag not given". Raises ``ConfigError`` naming the bad setting.
    """
    return load_config(AccessConfig, path=path, env_prefix=ENV_PREFIX, env=env, overrides=overrides)
