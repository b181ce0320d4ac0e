"""The agent's settings; defaults work for a local run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from common.config import load_config
from common.egress import EgressRule
from common.output import DEFAULT_OUTPUT_LIMIT


class AgentConfig(msgspec.Struct, kw_only=True):
    state_dir: str = ".idlegrid/agent"
    access_urls: list[str] = []  # wss://host:port of Access relays; filled in at enrollment when empty
    http_url: str = ""  # the relay's HTTPS base (enrollment, speed test); filled in at enrollment
    region: str = ""  # the agent's home region: with dns_domain, its relays are preferred
    # Relay discovery by DNS (SRV _idlegrid._tcp.<region>.<dns_domain>); empty: only access_urls are dialled,
    # which otherwise are the fallback while DNS fails.
    dns_domain: str = ""
    dns_nameservers: list[str] = []  # empty: the system resolver
    dns_port: int = 53
    dns_retry_s: float = 30.0  # after DNS failed, the configured relays are used this long before asking again
    # Rank the relay directory by measured latency (a TCP connect to each); off, its order and regions alone decide
    # (the fleet simulator: thousands of agents on one machine, where latency says nothing).
    relay_probe: bool = True
    relay_probe_timeout_s: float = 2.0  # a relay of the directory that takes longer to accept TCP ranks last
    directory_rank_ttl_s: float = 60.0  # the relay directory is probed and ranked again after this long
    simulate: str = ""  # e.g. "h100:8" or "a10:2,t4:1": simulated GPUs, reported as such
    # How simulated GPUs answer verification challenges (agent/benchmark/simulated.py): "" honestly, or a cheat CI
    # tests: "as:MODEL" (compute at MODEL's speed), "replay" (the first answer again), "late" (after the deadline).
    simulate_bench: str = ""
    # "docker" (any Docker-API engine, Podman included) or "process" (host processes in a sandbox: demos and tests,
    # never the default; see agent/runtime/process.py).
    runtime: str = "docker"
    docker_socket: str = "/var/run/docker.sock"
    # How the docker runtime gives containers their GPUs: auto, device_requests, cdi or by_name (agent/runtime/docker.py).
    docker_gpu_devices: str = "auto"
    # The network mode of renters' containers on the docker runtime (HostConfig.NetworkMode): "" is the engine's
    # default (a bridge). "slirp4netns" on Podman needs no network namespace files in /run/netns, which every podman
    # on a machine shares (the demo's container host: management/devgrid/podman_host.py says why).
    docker_network: str = ""
    # The GPU self-test (agent/runtime/selftest.py), run before the host is offered: the image its probe runs in on a
    # Docker-API engine (it must be on the host), and how long one GPU's test may take. A container the engine fails for
    # a reason that passes (runc under load) is tried gpu_selftest_tries times in all, at once with a short backoff; a GPU
    # still failing so (or too slow) is tested again gpu_selftest_retests times, gpu_selftest_retest_s later, then twice
    # as long each time, and offered once it passes.
    gpu_selftest_image: str = "docker.io/library/debian:bookworm-slim"
    gpu_selftest_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    gpu_selftest_tries: Annotated[int, msgspec.Meta(ge=1)] = 3
    gpu_selftest_retests: Annotated[int, msgspec.Meta(ge=0)] = 3
    gpu_selftest_retest_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    runtime_probe_s: float = 60.0  # how often the agent checks that its runtime can run containers
    runtime_probe_timeout_s: float = 5.0  # a runtime slower than this to answer the check offers nothing meanwhile
    # Targets on private addresses this host may reach for its renters (docs/security.md, "Egress"): storage endpoints
    # and image registries are otherwise refused when they are, or resolve to, loopback, private, link-local or other
    # non-public addresses. Entries are "HOST" (any port) or "HOST:PORT", matched against the host the renter wrote,
    # e.g. ["minio.lan:9000", "registry.lan", "127.0.0.1:5000"].
    egress_allow: list[str] = []
    # Images (the docker runtime; docs/images.md): pull what the host lacks, within these limits (0: no limit).
    image_pull: bool = True  # off: only images already on the host run (the provider loads them)
    image_registries_allowed: list[str] = []  # registry hosts ("ghcr.io", "127.0.0.1:5000", "*.example.org"); []: all
    image_registries_denied: list[str] = []  # wins over allowed
    image_max_gb: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # the largest image this host pulls
    image_pull_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 1800.0
    # The most the images the agent pulled may take together; past it, pulled images no container uses are removed,
    # least recently used first (images the provider loaded by hand are never removed).
    image_disk_budget_gb: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    image_progress_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0  # pull progress goes to the Master at most this often
    # The process runtime (agent/runtime/process.py): "dynamic" runs each container as a uid of its own from
    # process_uids; "" runs them as the agent's own user (isolation "none"). process_network "private" gives each
    # container a network namespace of its own (outbound through slirp4netns, none of the host's loopback); "host"
    # shares the host's.
    process_user: str = "dynamic"
    process_uids: str = "1000000-1065535"
    process_network: str = "private"
    process_work_dir: str = ""  # the process runtime's containers' working directories; "" is <state_dir>-work
    measure_bandwidth: bool = True
    bandwidth_interval_s: float = 6 * 3600.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 300.0  # the longest a relay's 503 Retry-After is honoured
    result_resend_s: float = 5.0
    # A heartbeat or telemetry report finding more than this many bytes still unsent on the link is skipped (the next
    # one says the same, newer) and counted, so reports never pile up ahead of command acks and results (issue 29).
    report_backlog_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024
    # While a container runs, how often the agent looks for one that ended on its own, to report it at once (a
    # heartbeat repeats every exit until the container is deleted, so 0, which turns the look off, only delays it).
    exit_check_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # A relay that stops acknowledging what the agent sends (its host or the network gone) is given up after this long
    # by the kernel (TCP_USER_TIMEOUT; heartbeats every few seconds keep data in flight), at no cost to the relay ...
    relay_ack_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # ... and one that still acknowledges but no longer answers (a hung process) by a WebSocket ping this often, given
    # up when the pong takes longer than ping_timeout_s. Pings every 20 s would cost a relay of 5,000 agents 250 pongs
    # a second.
    ping_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    ping_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Renter tunnels (agent/tunnel.py): how many this agent serves at once (more are refused, the renter told why),
    # how many TCP connections one port tunnel carries at once, and how long dialling the relay for one may take.
    max_tunnels: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 16
    max_tunnel_streams: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 32
    tunnel_dial_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # A host's tunnel slots are shared by its co-tenants: one account, and one workload, may hold only so many of them
    # (each also under max_tunnels), and a tunnel that carries no byte either way for tunnel_idle_timeout_s is closed
    # (0: never), so a forgotten follow-logs or terminal gives its slot back.
    max_tunnels_per_account: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 8
    max_tunnels_per_workload: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 6
    tunnel_idle_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 900.0
    # The output of a container the Master deletes is kept (agent/output.py) until the Master has read it: its last
    # output_keep_bytes bytes, for at most output_keep_s, and output_keep_total_bytes for all kept containers together.
    output_keep_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1024**3)] = DEFAULT_OUTPUT_LIMIT
    output_keep_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    output_keep_total_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1024**3
    # Object storage (agent/storage/, docs/storage.md): workloads' inputs, outputs and checkpoints, moved by this host.
    # storage_dir: their data while they run and the input cache ("" is <state_dir>-data); the cache keeps fetched
    # inputs within storage_cache_gb, least recently used out; every transfer together stays under
    # storage_bandwidth_mbps (0: no bound), storage_transfer_slots at once; a last upload at a delete may take
    # storage_final_upload_s.
    storage: bool = True
    storage_dir: str = ""
    storage_cache_gb: Annotated[float, msgspec.Meta(ge=0)] = 50.0
    storage_bandwidth_mbps: Annotated[float, msgspec.Meta(ge=0)] = 1000.0
    storage_transfer_slots: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    storage_final_upload_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    cert_renew_fraction: float = 2 / 3  # renew the certificate once this much of its lifetime has passed
    log_level: str = "info"

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    def egress_rule(self) -> EgressRule:
        """Where this host connects for its renters: public addresses, and the private ones its provider allows by
        name (ConfigError for an entry that is not HOST or HOST:PORT)."""
        return EgressRule.allowing(self.egress_allow)

    @property
    def storage_path(self) -> Path:
        return Path(self.storage_dir) if self.storage_dir else Path(f"{self.state_dir.rstrip('/')}-data")

    def private_paths(self) -> dict[str, str]:
        """This host's directories, as given and absolute, with the label a renter reads instead (agent/redact.py)."""
        work = self.process_work_dir or f"{self.state_dir.rstrip('/')}-work"
        named = {self.state_dir: "<agent state>", str(self.storage_path): "<agent data>", work: "<agent work>"}
        return {str(p): label for path, label in named.items() for p in {Path(path), Path(path).resolve()}}


def load_agent_config(
    path: Path | None = None, *, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> AgentConfig:
    return load_config(AgentConfig, path=path, env_prefix="IDLEGRID_AGENT_", env=env, overrides=overrides)
