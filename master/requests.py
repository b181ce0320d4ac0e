"""What management asks of the Master: commands, drain and undrain, revocation, GPU repair, reputation, signing keys,
tokens and API keys, and the reads behind them.

``MasterRequests`` is mixed into ``Master`` (master/master.py); together with the parts the Master exposes it
implements ``MasterPort`` (master/port.py), the interface management uses. Each request states its rule here and
leaves the bookkeeping to the part that owns it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from common.containers import CommandSpec
from common.errors import Conflict, InvalidRating, NotFound
from common.inventory import GpuSample
from common.overlay import OverlaySpec
from common.tunnel import TunnelKind
from common.wire import Config, RelayEntry, Revocations, encode
from master.accounts import AccountBook, AccountChange, IssuedKey
from master.agent_channel import AgentChannel
from master.allocations import offered
from master.authority import Authority
from master.commands import CommandLedger
from master.config import MasterConfig
from master.directory import RelayDirectoryAnnouncer
from master.enrollment import Enrollment
from master.events import EventLog
from master.faults import HealthWatch
from master.keys import SigningKeyInfo
from master.link import RelayHub
from master.overlay import OverlayAuthority, allocate_network
from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventData,
    EventRecord,
    GpuFault,
    GpuRecord,
    RevocationRecord,
    SecretRecord,
    TokenRecord,
)
from master.registry import Registry
from master.reputation import Reputation, reputation
from master.secrets import SecretVault
from master.states import AgentState, GpuState
from master.store.base import Store
from master.telemetry import TelemetryAggregator
from master.tunnels import OpenedTunnel, TunnelDispatch
from master.verifier import Verifier
from master.worker_calls import WorkerCalls


class MasterRequests:
    """The requests; the parts they use are the Master's (set by ``Master.__init__`` from master/composition.py)."""

    config: MasterConfig
    store: Store
    authority: Authority
    events: EventLog
    registry: Registry
    health: HealthWatch
    telemetry: TelemetryAggregator
    accounts: AccountBook
    enrollment: Enrollment
    hub: RelayHub
    commands: CommandLedger
    directory: RelayDirectoryAnnouncer
    channel: AgentChannel
    overlay: OverlayAuthority
    tunnels: TunnelDispatch
    verifier: Verifier
    secrets: SecretVault

    # --- relays and enrollment -----------------------------------------------------------------

    def relay_directory(self) -> list[RelayEntry]:
        """Every relay linked now that told where agents dial it, by id."""
        return self.directory.current()

    def enrollment_urls(self) -> list[tuple[str, str]]:
        """(region, https:// URL) of every relay linked now that told where its HTTPS port (enrollment) is, by relay id:
        what a new host enrolls through (management/onboarding/)."""
        links = sorted(self.hub.links.values(), key=lambda link: link.relay_id)
        return [(link.region, link.http_url) for link in links if link.http_url]

    def ca_chain_pem(self) -> bytes:
        """The platform CA's certificate chain: public, what an enrolling host trusts its relay by."""
        return self.authority.ca.chain_pem()

    # --- command-signing keys ------------------------------------------------------------------

    async def rotate_signing_key(self) -> SigningKeyInfo:
        """A new current key; the old one keeps verifying commands already signed until it is retired."""
        info = self.authority.keys.rotate()
        await self.events.record("signing_key.rotated", info.key_id)
        await self._announce_keys()
        return info

    async def retire_signing_key(self, key_id: str) -> SigningKeyInfo:
        """Agents stop trusting ``key_id``; open commands it signed are re-signed first, so none is lost."""
        info = self.authority.keys.retire(key_id)
        resigned = await self.commands.resign_retired(key_id)
        await self.events.record("signing_key.retired", key_id, resigned=resigned)
        await self._announce_keys()
        return info

    async def _announce_keys(self) -> int:
        """Tell every connected agent the keys in force now; agents not connected learn them in their welcome."""
        frame = encode(
            Config(
                command_keys=self.authority.command_keys(),
                key_endorsements=self.authority.key_endorsements(),
                retired_keys=self.authority.keys.retired_keys(),
            )
        )
        return await self.channel.announce_to_agents(frame)

    # --- hosts: revocation, drain ---------------------------------------------------------------

    async def revoke(self, agent_id: str, reason: str = "revoked by an operator") -> AgentRecord:
        agent = self.registry.get(agent_id)
        now = time.time()
        # Every certificate the agent holds that is still valid, not just its latest: renewal leaves the old one usable.
        serials = [s for s in (agent.cert_serial, *agent.previous_serials) if s and s not in self.channel.revoked]
        for serial in serials:
            self.channel.revoked.add(serial)
            await self.store.revocations.put(RevocationRecord(serial=serial, agent_id=agent.id, revoked_at=now, reason=reason))
        await self.registry.transition(agent, "revoke", reason)
        await self.hub.broadcast(encode(Revocations(serials=sorted(self.channel.revoked))))
        return agent

    async def drain(self, agent_id: str) -> AgentRecord:
        """The host takes no new work and its free GPUs are no longer offered; running containers stay."""
        agent = self.registry.get(agent_id)
        if agent.state != AgentState.MAINTENANCE.value and not self.registry.may(agent, "drain"):
            raise Conflict(f"agent {agent_id} is {agent.state} and cannot be drained")
        agent.drained = True
        if not await self.registry.transition(agent, "drain", "drained by an operator"):
            await self.registry.save(agent)
        return agent

    async def undrain(self, agent_id: str) -> AgentRecord:
        """A drained host takes work again, and its free GPUs are offered again."""
        agent = self.registry.get(agent_id)
        if not agent.drained and agent.state != AgentState.MAINTENANCE.value:
            raise Conflict(f"agent {agent_id} is {agent.state} and not drained")
        agent.drained = False
        if not await self.registry.transition(agent, "undrain", "undrained by an operator"):
            await self.registry.save(agent)  # offline (or quarantined): comes back ready, not to maintenance
            await self.registry.settle_gpus(agent)
        return agent

    # --- the market: reputation that pays (master/reputation.py) -------------------------------

    async def record_rental_outcome(self, agent_id: str, *, failed: bool, reason: str, now: float) -> Reputation:
        """A rental on ``agent_id`` ended: without a host failure (``failed`` False) or through the host (a container
        that would not start, the host offline mid-run, a GPU fault). Counts it in the ``rentals`` component, stores
        the agent and records ``agent.reputation`` with the old and new score and ``reason``."""
        agent = self.registry.get(agent_id)
        before = reputation(agent)
        if failed:
            agent.rentals_failed += 1
        else:
            agent.rentals_completed += 1
        return await self._reputation_changed(agent, before, "rentals", reason, now)

    async def record_rating(self, agent_id: str, rating: int, rental_id: str, now: float, *, weight: int = 1) -> Reputation:
        """A renter rated its ended rental ``rental_id`` on ``agent_id`` (1..5): counted ``weight`` times in the
        ``ratings`` component (a rating weighs what the renter paid), with an ``agent.reputation`` event. Whether the
        rental may be rated, and its weight, are the caller's (management/market/operations.py ``rate_rental``)."""
        if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
            raise InvalidRating(f"rating: {rating!r} is not a whole number from 1 to 5")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise InvalidRating(f"weight: {weight!r} is not a whole number of at least 1")
        agent = self.registry.get(agent_id)
        before = reputation(agent)
        agent.ratings_count += weight
        agent.ratings_sum += rating * weight
        said = f"rental {rental_id} rated {rating} of 5" + (f" (weight {weight}: what was paid)" if weight > 1 else "")
        return await self._reputation_changed(agent, before, "ratings", said, now)

    async def _reputation_changed(
        self, agent: AgentRecord, before: Reputation, component: str, reason: str, now: float
    ) -> Reputation:
        after = reputation(agent)
        await self.registry.save(agent)
        await self.store.events.append(
            EventRecord(
                ts=now,
                kind="agent.reputation",
                subject=agent.id,
                data={
                    "component": component,
                    "old": before.score,
                    "new": after.score,
                    "component_old": before.components[component],
                    "component_new": after.components[component],
                    "reason": reason,
                },
            )
        )
        return after

    # --- commands, GPUs, events, tokens and keys ------------------------------------------------

    async def create_command(self, agent_id: str, spec: CommandSpec, *, timeout_s: float | None = None) -> CommandRecord:
        """Sign and dispatch the container command ``spec`` is the body of (its kind follows from its type); Conflict
        when the host or a GPU it names cannot take it, InvalidCommand when ``spec`` breaks its type's constraints."""
        return await self.commands.create(agent_id, spec, timeout_s=timeout_s)

    def check_command_target(self, agent_id: str) -> None:
        """NotFound when there is no host ``agent_id``, Conflict when it takes no commands: what ``create_command``
        checks first, for a caller that still has a body to parse (the API answers these before a malformed body)."""
        self.commands.target(agent_id)

    async def command(self, command_id: str, *, wait_s: float = 0.0) -> CommandRecord:
        """A command as it stands; an open one once final or after ``wait_s`` seconds, whichever comes first."""
        return await self.commands.get(command_id, wait_s=wait_s)

    async def list_commands(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> list[CommandRecord]:
        return await self.store.commands.list(agent_id=agent_id, states=states, limit=limit)

    def agent(self, agent_id: str) -> AgentRecord:
        return self.registry.get(agent_id)

    def overlay_network(self, held: Iterable[str]) -> str:
        """A block for a new gang's network, none of ``held`` (the open workloads' blocks); "" when the overlay is off
        (no lighthouse configured). NoNetworkLeft when the range is full."""
        if not self.overlay.enabled:
            return ""
        return allocate_network(held, self.overlay.settings)

    def overlay_spec(
        self,
        *,
        workload_id: str,
        network: str,
        replica: int,
        replicas: int,
        gpus: int,
        agent_id: str,
        now: float,
        max_duration_s: float | None = None,
        blocklist: Sequence[str] = (),
        attempt: int = 0,
    ) -> OverlaySpec | None:
        """Replica ``replica``'s place on ``network``, its certificate signed for its host's overlay key; None when the
        host sent no key (it cannot run the overlay: its replica runs without one, and its peers cannot reach it)."""
        agent = self.registry.agents.get(agent_id)
        if not network or agent is None or not agent.overlay_key:
            return None
        return self.overlay.replica_spec(
            workload_id=workload_id,
            network=network,
            replica=replica,
            replicas=replicas,
            gpus=gpus,
            public_key_pem=agent.overlay_key,
            now=now,
            max_duration_s=max_duration_s,
            blocklist=blocklist,
            attempt=attempt,
        )

    def overlay_paths(self, agent_id: str, container: str) -> dict[str, str]:
        """How replica ``container`` on that host reaches each peer (overlay address -> "direct" or "relay"), as its
        agent last said; empty when it said nothing."""
        return dict(self.registry.overlay_paths.get(agent_id, {}).get(container, {}))

    def pull_progress(self, agent_id: str, container: str) -> str:
        """How the image pull of ``container``'s create on that host goes ("pulling image: 12.0 MB of 45.3 MB, 1 of 3
        layers"), as its agent last said; "" when no pull is under way."""
        return self.channel.pulls.get((agent_id, container), "")

    def serve_worker_calls(self, calls: WorkerCalls | None) -> None:
        """Endpoint workers' calls go to ``calls`` from now on (management's request queue: docs/endpoints.md, "The
        agent's side"); None: each is answered 503, which a worker retries."""
        self.channel.worker_calls = calls

    async def repair_gpu(self, uuid: str) -> GpuRecord:
        """An operator says ``uuid`` is sound again (after a reset, a reseat, a swap): its fault is cleared and it
        goes back to the state its holder and host call for. Its current uncorrectable ECC count is accepted.

        It also settles who has the card: other hosts' refused claims on it are dropped (their flag cleared) and
        the holder keeps it. A GPU neither faulty nor claimed has nothing to repair (Conflict)."""
        gpu = self.registry.gpus.get(uuid)
        if gpu is None:
            raise NotFound(f"no GPU {uuid!r}")
        host = self.registry.agents.get(gpu.agent_id)
        cleared = await self.registry.clear_claims(uuid, "cleared by an operator's repair")
        if gpu.fault is None and gpu.state != GpuState.FAULTY.value:
            if cleared:
                return gpu
            raise Conflict(f"GPU {uuid} is {gpu.state}, not faulty: there is nothing to repair")
        if gpu.fault is None and host is not None and host.state == AgentState.QUARANTINED.value:
            raise Conflict(f"GPU {uuid} is faulty because host {host.id} is quarantined; release the host instead")
        latest = self.telemetry.latest.get(uuid)
        counted = max(gpu.ecc_acknowledged, latest.ecc_uncorrected if latest is not None else 0)
        self.health.forget([uuid])
        await self.registry.clear_fault(gpu, "repaired by an operator", ecc_acknowledged=counted)
        return gpu

    def gpus(self, agent_id: str | None = None) -> list[GpuRecord]:
        if agent_id is not None:
            return self.registry.gpus_of(agent_id)
        return sorted(self.registry.gpus.values(), key=lambda g: (g.agent_id, g.index))

    def offered(self, gpu: GpuRecord) -> bool:
        """Whether renters are offered ``gpu`` now (allocations.offered, with the operator's setting)."""
        host = self.registry.agents.get(gpu.agent_id)
        return host is not None and offered(gpu, host, allow_sandboxed=self.config.offer_sandboxed_hosts)

    async def events_after(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        return await self.store.events.list(subject=subject, kind_prefix=kind_prefix, after_seq=after_seq, limit=limit)

    async def create_token(self, provider: str, ttl_s: float | None = None) -> tuple[str, TokenRecord]:
        """A one-time join token for ``provider`` (an enabled provider account); shown once, stored hashed."""
        await self.accounts.require_provider(provider)
        return await self.enrollment.create_token(provider, self.config.token_ttl_s if ttl_s is None else ttl_s)

    async def create_api_key(self, name: str, role: str = "operator") -> str:
        """A key naming no account, working as ``role`` (the operator): what tests and old tools use. Keys for an
        account are issued by ``accounts.create_key``."""
        return await self.accounts.create_legacy_key(name, role)

    async def check_api_key(self, key: str) -> ApiKeyRecord:
        """The key's record (NotFound for a key never issued), remembered a while: see master/accounts.py."""
        return (await self.accounts.credential(key)).key

    # --- the writes management makes on the parts: one operation each, the part's own rules kept --------------

    async def record_event(self, kind: str, subject: str, /, **data: Any) -> None:
        await self.events.record(kind, subject, **data)

    async def record_events(self, events: list[tuple[str, str, EventData]]) -> None:
        """(kind, subject, data) each, in one write."""
        await self.events.record_many(events)

    async def mark_gpu_faulty(self, gpu: GpuRecord, fault: GpuFault) -> None:
        """``gpu`` leaves service with ``fault`` (an alert rule's verdict: management/monitoring/alert_loop.py)."""
        await self.registry.mark_faulty(gpu, fault)

    async def clear_gpu_fault(self, gpu: GpuRecord, reason: str, *, ecc_acknowledged: int | None = None) -> None:
        await self.registry.clear_fault(gpu, reason, ecc_acknowledged=ecc_acknowledged)

    async def create_account(self, rec: AccountRecord) -> AccountRecord:
        return await self.accounts.create(rec)

    async def update_account(self, account_id: str, change: AccountChange) -> AccountRecord:
        return await self.accounts.update(account_id, change)

    async def set_password(self, account_id: str, password: str, *, current_password: str | None = None) -> AccountRecord:
        return await self.accounts.set_password(account_id, password, current_password=current_password)

    async def create_account_key(self, account_id: str, name: str) -> IssuedKey:
        """A new API key of ``account_id``, shown once (``create_api_key`` is the legacy one naming no account)."""
        return await self.accounts.create_key(account_id, name)

    async def revoke_account_key(self, key_id: str) -> ApiKeyRecord:
        return await self.accounts.revoke_key(key_id)

    async def create_secret(self, account: str, name: str, value: str) -> SecretRecord:
        return await self.secrets.create(account, name, value)

    async def delete_secret(self, account: str, name: str) -> None:
        await self.secrets.delete(account, name)

    async def open_tunnel(
        self, kind: TunnelKind, *, account: str, workload: str, agent_id: str, container: str, **params: Any
    ) -> OpenedTunnel:
        """A signed ticket for a renter's tunnel to ``container``, sent to its agent (master/tunnels.py)."""
        return await self.tunnels.open(kind, account=account, workload=workload, agent_id=agent_id, container=container, **params)

    async def request_verification(self, agent_id: str, gpu_uuids: Iterable[str] = ()) -> list[str]:
        """An operator's measured verification of ``agent_id``'s GPUs, now (master/verifier.py): the challenge ids."""
        return await self.verifier.request(agent_id, gpu_uuids)

    def watch_host_samples(self, agent_id: str, now: float) -> dict[str, list[GpuSample]]:
        """``agent_id``'s recent samples per GPU, oldest first. Asking watches the host: from then on the Master keeps a
        short ring of its samples (master/telemetry.py, RecentSamples), for a while after the last ask; the first
        answer holds each GPU's latest sample."""
        latest = self.telemetry.latest
        self.telemetry.recent.watch(agent_id, now, [latest[g.uuid] for g in self.registry.gpus_of(agent_id) if g.uuid in latest])
        return self.telemetry.recent.of(agent_id)

    def signing_keys(self) -> list[SigningKeyInfo]:
        """Every command-signing key, newest first."""
        return self.authority.keys.describe()
