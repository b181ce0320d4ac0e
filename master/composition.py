"""The Master's composition root: builds its parts, once, in the order they depend on each other.

``compose(config, store)`` returns ``Parts``: the authority (CA and command keys), the tier policy, the event log, GPU
allocations, the change feed, the registry (agents and GPUs), GPU health, telemetry and its history, accounts,
enrollment, the relay hub, the command ledger (``commands``), tunnels, metrics, the relay directory, the agent
channel (master/agent_channel.py: every frame relays and agents send) and the upkeep its loops run
(master/upkeep.py). Nothing here runs anything: master/master.py starts and stops what is built here.

What calls what (the hub's handlers, the ledger's dispatch, the directory's announcements) is wired here, so each
part's own module names only what it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.pki import server_tls_context
from master.accounts import AccountBook
from master.agent_channel import AgentChannel
from master.allocations import GpuAllocations
from master.authority import Authority
from master.changes import ChangeFeed, CommandFinished
from master.commands import CommandLedger
from master.config import MasterConfig
from master.directory import RelayDirectoryAnnouncer
from master.enrollment import Enrollment
from master.events import EventLog
from master.faults import FaultRules, HealthWatch
from master.history import HistoryKeeper
from master.link import RelayHub
from master.loops import Loop
from master.metrics import FleetGauges, MasterMetrics
from master.network_floors import NetworkFloors
from master.pacing import intake_bounds, pace_settings
from master.records import CommandRecord
from master.registry import Registry
from master.secrets import SecretBox, SecretVault
from master.store.base import Store
from master.telemetry import TelemetryAggregator
from master.tiers import TierPolicy
from master.tunnels import TunnelDispatch
from master.upkeep import Upkeep
from master.verifier import Verifier, verifier_for


@dataclass(eq=False)
class Parts:
    """Everything a Master is made of; built by ``compose``, one of each."""

    config: MasterConfig
    store: Store
    authority: Authority
    policy: TierPolicy
    events: EventLog
    allocations: GpuAllocations
    changes: ChangeFeed
    registry: Registry
    health: HealthWatch
    telemetry: TelemetryAggregator
    history: HistoryKeeper
    network_floors: NetworkFloors
    accounts: AccountBook
    enrollment: Enrollment
    hub: RelayHub
    commands: CommandLedger
    tunnels: TunnelDispatch
    metrics: MasterMetrics
    directory: RelayDirectoryAnnouncer
    verifier: Verifier  # measured verification of GPUs: challenges and their outcomes (master/verifier.py)
    secrets: SecretVault  # renters' secrets, sealed with the Master's secrets.key (master/secrets.py)
    # Built once the rest is (they read every other part), by ``compose``.
    channel: AgentChannel = field(init=False)
    upkeep: Upkeep = field(init=False)

    def loops(self) -> list[Loop]:
        """The background loops a serving Master runs (master/upkeep.py has their steps)."""
        config, upkeep = self.config, self.upkeep
        restart_s = config.loop_restart_s
        return [
            Loop("sweep", min(1.0, config.heartbeat_s / 4), upkeep.sweep, restart_s),
            Loop("flush", config.rollup_flush_s, upkeep.flush, restart_s),
            Loop("history", config.history_period_s, upkeep.keep_history, restart_s),
            Loop("verification", config.verify_loop_s, self.verifier.step, restart_s),
        ]


def compose(config: MasterConfig, store: Store, *, link_refusal: Callable[[], str | None] | None = None) -> Parts:
    """Build every part of a Master on ``store`` (already fenced when high availability is on).

    ``link_refusal``: asked at each relay's link whether to refuse it (the leader's URL while this Master stands by).
    """
    state_dir = config.state_path
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    authority = Authority.open(state_dir, names=config.server_names, ips=config.server_ips)
    policy = TierPolicy.load(Path(config.tier_policy) if config.tier_policy else None)
    events = EventLog(store)
    changes = ChangeFeed()  # what management code subscribes to: master/changes.py
    allocations = GpuAllocations(changes)
    registry = Registry(store, events, policy, allocations, changes=changes)
    health = HealthWatch(
        FaultRules(
            fatal_xids=frozenset(config.fatal_xids),
            max_temperature_c=config.max_temperature_c,
            overheat_samples=config.overheat_samples,
            cool_samples=config.cool_samples,
        )
    )
    telemetry = TelemetryAggregator(store)
    history = HistoryKeeper(
        store,
        lambda: registry.gpus.keys(),
        minute_retention_s=config.history_minute_retention_s,
        hourly_retention_s=config.history_hourly_retention_s,
        agent_ids=lambda: registry.agents.keys(),  # hosts' own history
    )
    network_floors = NetworkFloors(policy)  # hosts kept from a tier by their bandwidth (metrics)
    # The hub calls the channel, built last (it reads every other part): these lambdas look it up when called.
    hub = RelayHub(
        server_tls_context(authority.cert_file, authority.key_file, authority.ca_file, require_client_cert=True),
        lambda link, frame: parts.channel.on_link_frame(link, frame),
        lambda link: parts.channel.on_link_closed(link),
        lambda: sorted(parts.channel.revoked),
        on_open=lambda link: parts.channel.on_link_opened(link),
        refusal=link_refusal,
        lanes=intake_bounds(config),  # intake lanes and report pacing (master/intake.py, master/pacing.py, docs/overload.md)
        pace=pace_settings(config),
        on_alive=lambda link, agent_id: parts.channel.alive_at_once(link, agent_id),
    )
    box = SecretBox.open(authority.pki_dir)  # beside the CA: backed up and shared with it
    commands = CommandLedger(
        store, events, registry, authority.keys, hub.send_to_agent, box=box, timeout_s=config.command_timeout_s
    )
    metrics = MasterMetrics(
        FleetGauges(
            lambda: registry.agents.values(),
            lambda: registry.gpus.values(),
            lambda: commands.open.values(),
            lambda: len(hub.links),
            latest=lambda: telemetry.latest,
            per_gpu=config.metrics_per_gpu,
            below_network_floor=lambda: [
                short.agent for short in network_floors.shortfalls(registry.agents.values(), registry.gpus_of)
            ],
        )
    )
    store.metrics.register(metrics.registry)
    hub.register_metrics(metrics.registry)  # intake lanes, telemetry shed, report pace
    hub.on_thinning = telemetry.note_thinning  # rollups of paced or shed minutes are marked thinner
    verifier = verifier_for(config, registry, events, hub.send_to_agent, policy)
    parts = Parts(
        config=config,
        store=store,
        authority=authority,
        policy=policy,
        events=events,
        allocations=allocations,
        changes=changes,
        registry=registry,
        health=health,
        telemetry=telemetry,
        history=history,
        network_floors=network_floors,
        accounts=AccountBook(store, max_keys=config.api_keys_per_account),
        enrollment=Enrollment(store, authority.ca, cert_validity_s=config.agent_cert_s),
        hub=hub,
        commands=commands,
        tunnels=TunnelDispatch(
            hub, authority.keys, events, ticket_s=config.tunnel_ticket_s, bytes_per_s=config.tunnel_bytes_per_s
        ),
        metrics=metrics,
        directory=RelayDirectoryAnnouncer(
            lambda: hub.links.values(), hub.announce_directory, coalesce_s=config.relay_directory_coalesce_s
        ),
        verifier=verifier,
        secrets=SecretVault(store, box),
    )
    parts.channel = AgentChannel(parts)
    parts.upkeep = Upkeep(parts)
    commands.on_final = lambda record: _command_finished(parts, record)
    return parts


def _command_finished(parts: Parts, record: CommandRecord) -> None:
    """A command reached its final state: counted, and told to the change feed."""
    parts.metrics.command_finished(record)
    if parts.changes.wants(CommandFinished):
        parts.changes.publish(
            CommandFinished(
                command_id=record.id,
                agent_id=record.agent_id,
                kind=record.kind,
                state=record.state,
                container=str(record.spec.get("name", "")),
                error=record.error,
            )
        )
