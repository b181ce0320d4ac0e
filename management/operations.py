"""The façade of operations: what the API (and later the console) may ask of the Master, one method each.

This is the only place in ``management/`` that composes Master calls or reads the Master's
collaborators (registry, store, ledger, telemetry, hub, authority). Handlers parse a request, make
one call here and render what comes back; they never reach into the Master themselves.

Lists are keyset-paginated: a method takes the key of the last item of the previous page
(``after``) and a ``limit``, and returns a ``Page`` whose ``next_key`` continues it (None at the
end). Ownership filters (``owner``: a provider account) are applied here, as the API's auth module
decided them, so a provider's page never contains another account's hosts.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import msgspec

from common.errors import Conflict, InvalidPassword, NotFound, SignInRefused
from common.inventory import GpuSample
from management.fleet import FleetFigures, fleet_figures
from management.market.ledger import Statement, StatementLine
from management.market.market import Market
from management.market.operations import FundsDetail, MarketOperations, RentalDetail
from management.market.prices import HostPrice, PriceBook, PriceSetting, grid_default_of
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.history import GpuSeries, TelemetryHistory, Window, gpu_history, host_history, resolution_of, window_of
from management.monitoring.notifier import WebhookNotifier
from management.monitoring.observe import FleetObserver
from management.monitoring.report_source import ReportSource
from management.monitoring.reports import Report
from management.monitoring.rules import AlertRule, load_rules
from management.monitoring.settings import AlertListing, AlertSettings, RuleListing, account_viewer, notifier_settings
from management.monitoring.visibility import Viewer
from management.onboarding.service import Onboarding
from management.outputs import OutputCollector, OutputSettings
from management.renter_access import RenterAccess
from management.scheduler.book import WorkloadBook
from management.scheduler.loop import SchedulerLoop, SchedulerSettings
from management.scheduler.model import Explanation
from management.verification import VerificationService
from master.accounts import AccountChange, Credential, IssuedKey
from master.config import ConsoleSettings
from master.keys import SigningKeyInfo
from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuRecord,
    KeptOutput,
    PriceRecord,
    RevocationRecord,
    SilenceRecord,
    TokenRecord,
    WebhookRecord,
    WorkloadRecord,
    WorkloadSpec,
)
from master.service import Master
from master.store.aggregates import workload_order
from master.tiers import describe_tiers

T = TypeVar("T")

# A page of commands is found by reading the newest ones until the cursor's position; the window grows by this
# factor while the position lies beyond it (the store lists commands newest first, with a limit but no cursor).
COMMAND_WINDOW_GROWTH = 4


# --- sort keys: where a page ends and the next begins ------------------------------------------------------------
# Encoded as JSON arrays inside the API's cursors; anyone can build a cursor, so every field is bounded.

KeyText = Annotated[str, msgspec.Meta(max_length=128)]
Position = Annotated[int, msgspec.Meta(ge=0, le=10**9)]


class AgentKey(msgspec.Struct, array_like=True, frozen=True):
    id: KeyText


class GpuKey(msgspec.Struct, array_like=True, frozen=True):
    agent_id: KeyText
    index: Annotated[int, msgspec.Meta(ge=-1, le=10**6)]
    uuid: KeyText


class CommandKey(msgspec.Struct, array_like=True, frozen=True):
    created_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)]
    id: KeyText
    depth: Position  # how many commands the previous page's read went through: where the next read starts looking


class WebhookKey(msgspec.Struct, array_like=True, frozen=True):
    created_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)]
    id: KeyText


class SeqKey(msgspec.Struct, array_like=True, frozen=True):
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class WorkloadKey(msgspec.Struct, array_like=True, frozen=True):
    listed: Annotated[str, msgspec.Meta(max_length=160)]  # master.store.aggregates.workload_order of the last item


class AccountIdKey(msgspec.Struct, array_like=True, frozen=True):
    id: KeyText


class PositionKey(msgspec.Struct, array_like=True, frozen=True):
    position: Position  # in a short list kept in memory, in its own order


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_key: msgspec.Struct | None  # the sort key of the last item, when more may follow


@dataclass(frozen=True)
class HostedReplica:
    """One replica of a workload placed on a host, as the host's provider may see it: what runs on its GPUs, never
    the renter's env, command, labels or account (docs/workloads.md, "What a provider sees")."""

    workload_id: str
    name: str
    image: str
    replica: int
    units: list[str]  # the GPU uuids (or MIG instance ids) the replica's container was given
    container: str
    state: str  # the workload's
    container_state: str  # the assignment's: pending | running | exited | deleting | deleted
    started_at: float | None


@dataclass(frozen=True)
class AgentDetail:
    """An agent with what its view shows beside the record."""

    agent: AgentRecord
    gpus: list[GpuRecord]
    latest: dict[str, GpuSample]
    reachable: bool  # a relay link carries it now: commands sent to it are delivered at once
    offered: frozenset[str]  # uuids of its GPUs renters are offered now
    workloads: list[HostedReplica] = field(default_factory=list)  # open workloads' replicas placed on it
    holders: Mapping[str, str] = field(default_factory=dict)  # GPU or MIG instance uuid -> the container holding it


@dataclass(frozen=True)
class GpuDetail:
    gpu: GpuRecord
    latest: GpuSample | None
    offered: bool  # renters are offered it now: available, on a host that isolates workloads well enough
    holders: Mapping[str, str] = field(default_factory=dict)  # the GPU's and its MIG instances' holding containers


@dataclass(frozen=True)
class PriceListing:
    """Providers' price records (defaults have agent_id ""), the grid's default, and the currency they are in."""

    records: list[PriceRecord]
    grid_default: HostPrice
    currency: str


@dataclass(frozen=True)
class PriceRecordDetail:
    record: PriceRecord
    currency: str


@dataclass(frozen=True)
class HostPriceDetail:
    """The price in force on one host and where it comes from (``price.source``: host | provider | grid)."""

    agent_id: str
    provider: str
    price: HostPrice
    currency: str


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once; only its hash is stored
    record: TokenRecord


@dataclass(frozen=True)
class AuditEntry:
    """One successful change made through the API, as the audit middleware saw it."""

    account: str
    key_id: str
    role: str
    method: str
    route: str  # the route's pattern, e.g. "/api/v1/agents/{agent_id}/drain"
    target: str  # what it changed: the id in the path, or the id of what it created
    status: int


@dataclass(frozen=True)
class HostChoices:
    """The values a hosts list may be filtered by."""

    regions: list[str]
    tiers: list[str]
    models: list[str]


@dataclass(frozen=True)
class HostSamples:
    """One host's GPUs and their recent samples (uuid -> samples, oldest first)."""

    agent_id: str
    gpus: list[GpuRecord]
    samples: dict[str, list[GpuSample]]


@dataclass(frozen=True)
class Health:
    store: str
    relays: list[str]
    # High availability (docs/ha.md): leader | standby | stepped_down, and the leader's API URL when another leads.
    role: str = "leader"
    leader: str = ""
    ready: bool = True  # it serves: leads, and has loaded the state it took over


@dataclass(frozen=True)
class WorkloadOverview:
    """Everything the console's workload page shows, read in one call: the record, why it waits (while queued), how
    it pays (the market's terms), its events (oldest first), its rentals and what they charged so far, and the output
    kept of its deleted containers (by replica, then attempt)."""

    workload: WorkloadRecord
    explanation: Explanation | None
    terms: dict[str, Any]
    events: list[EventRecord]
    rentals: list[RentalDetail]
    charged: int  # micro-units, refunds taken off
    currency: str
    outputs: list[KeptOutput] = field(default_factory=list)


@dataclass(frozen=True)
class SpendPoint:
    start: float  # unix time the bucket starts
    spent: int  # micro-units charged in it (refunds taken off); credits are not spending


@dataclass(frozen=True)
class SpendOverTime:
    account: str
    currency: str
    bucket_s: float
    points: list[SpendPoint]  # oldest first, every bucket from the first charge to now (empty ones included)
    total: int


@dataclass(frozen=True)
class BillingOverview:
    """The console's billing page in one read: the balance, spend per hour, and one page of the ledger."""

    funds: FundsDetail
    spend: SpendOverTime
    statement: Statement


def _page(items: list[T], limit: int, key: Callable[[T], msgspec.Struct]) -> Page[T]:
    """``items`` holds up to ``limit + 1`` candidates: one more than asked says that another page follows."""
    if len(items) > limit:
        return Page(items[:limit], key(items[limit - 1]))
    return Page(items, None)


class Operations:
    def __init__(
        self,
        master: Master,
        *,
        book: WorkloadBook | None = None,
        scheduler: SchedulerLoop | None = None,
        prices: PriceBook | None = None,
    ) -> None:
        self._master = master
        self.verification = VerificationService(master)  # measured verification (management/verification.py)
        # The one writer of providers' prices; the offer index and the scheduler read (and subscribe to) the same book.
        self.prices = prices or PriceBook(
            master.store.prices, grid_default_of(master.config), time.time, owner_of=self._provider_of
        )
        # The one writer of workload records, shared with the scheduling loop.
        self.workloads = book or WorkloadBook(master.store, master.events, master, policy=master.policy)
        # Offers, the ledger and the metering of rentals; the scheduler reads its prices and who has money.
        self.market = MarketOperations(master, self.workloads, Market(master, self.workloads, self.prices))
        # Reports along dimensions (management/monitoring/reports.py), read from the registry and the store.
        self.reports = ReportSource(master)
        # Renter access: tunnels to a workload's containers through the relays (management/renter_access.py).
        self.access = RenterAccess(master, self.get_workload, master.store.outputs)
        # Deleted workload containers' output, read from their hosts and kept (management/outputs.py); the loop runs
        # only where it was started (the Master's server), a renter's request reads a pending one at once.
        self.outputs = OutputCollector(
            master,
            self.workloads,
            master.store.outputs,
            lambda kept: self.access.read_output(kept, limit=self.outputs.settings.limit_bytes),
            OutputSettings.of(master.config),
            restart_s=master.config.loop_restart_s,
        )
        self.access.collect = self.outputs.collect
        # The loop runs only where it was started (the Master's server); explaining needs only its snapshot.
        self.scheduler = scheduler or SchedulerLoop(
            master,
            self.workloads,
            SchedulerSettings.of(master.config),
            prices=self.prices.price,
            funded=self.market.market.funded,
            budget=self.market.market.budget,
            period_s=master.config.metering_period_s,
        )
        self.market.fit_check = self.scheduler.never_fits
        # Alert rules evaluated over the fleet, notifications to webhooks (management/monitoring/); the loop runs
        # only where it was started (the Master's server).
        self.alerts = AlertLoop(
            FleetObserver(master, self.workloads.open_workloads, self.market.market.meter.balance_cover_s),
            load_rules(Path(master.config.alert_rules) if master.config.alert_rules else None),
            notifier=WebhookNotifier(settings=notifier_settings(master.config), viewer_of=account_viewer(master.accounts)),
            period_s=master.config.alert_period_s,
        )
        self.alert_settings = AlertSettings(master.store, self.alerts, list(self.alerts.rules), time.time)
        # Providers' hosts onboard from the grid: the installer, the CA and the agent's package (management/onboarding/).
        self.onboarding = Onboarding(master)

    # --- accounts and API keys ------------------------------------------------------------------
    # ``owner`` (as auth decided it): the one account a provider's or renter's call may see; another account
    # answers NotFound, as a missing one does.

    async def credential(self, key: str) -> Credential:
        return await self._master.accounts.credential(key)

    @staticmethod
    def _owned(account_id: str, owner: str | None) -> None:
        if owner is not None and account_id != owner:
            raise NotFound(f"no account {account_id!r}")

    async def create_account(self, account: AccountRecord) -> AccountRecord:
        return await self._master.accounts.create(account)

    async def get_account(self, account_id: str, *, owner: str | None = None) -> AccountRecord:
        self._owned(account_id, owner)
        return await self._master.accounts.get(account_id)

    async def list_accounts(
        self, *, role: str | None = None, owner: str | None = None, after: AccountIdKey | None = None, limit: int
    ) -> Page[AccountRecord]:
        """Ordered by id. A non-operator's list holds its own account only."""
        if owner is not None:
            own = await self._master.accounts.get(owner)
            wanted = (role is None or own.role == role) and (after is None or own.id > after.id)
            return Page([own] if wanted else [], None)
        found = await self._master.accounts.list(role=role, after=after.id if after else None, limit=limit + 1)
        return _page(found, limit, lambda a: AccountIdKey(a.id))

    async def update_account(self, account_id: str, change: AccountChange) -> AccountRecord:
        return await self._master.accounts.update(account_id, change)

    async def create_api_key(self, account_id: str, name: str, *, owner: str | None = None) -> IssuedKey:
        self._owned(account_id, owner)
        return await self._master.accounts.create_key(account_id, name)

    async def list_api_keys(
        self, account_id: str, *, owner: str | None = None, after: PositionKey | None = None, limit: int
    ) -> Page[ApiKeyRecord]:
        """Oldest first; the key is the position in that order (keys are only ever added, at the end)."""
        self._owned(account_id, owner)
        keys = await self._master.accounts.keys(account_id)
        start = after.position + 1 if after else 0
        page = _page(list(enumerate(keys[start : start + limit + 1], start)), limit, lambda k: PositionKey(k[0]))
        return Page([k for _, k in page.items], page.next_key)

    async def revoke_api_key(self, key_id: str, *, owner: str | None = None) -> ApiKeyRecord:
        key = await self._master.accounts.key(key_id)
        if owner is not None and key.subject != owner:
            raise NotFound(f"no API key {key_id!r}")
        return await self._master.accounts.revoke_key(key_id)

    # --- passwords and the console's sign-in (master/passwords.py, docs/console.md) ------------------------------

    async def set_password(
        self, account_id: str, password: str, *, owner: str | None = None, by: str, current_password: str | None = None
    ) -> AccountRecord:
        """Set ``account_id``'s password as account ``by``; changing one's own needs the current password when one is
        set. Every console session of the account ends (its password epoch moves on)."""
        self._owned(account_id, owner)
        own = account_id == by
        if own and current_password is None and (await self._master.accounts.get(account_id)).password_hash:
            raise InvalidPassword("current_password: required to change your own password")
        updated = await self._master.accounts.set_password(
            account_id, password, current_password=current_password if own else None
        )
        await self._master.events.record("account.password_set", account_id, by=by)
        return updated

    async def sign_in(self, account_id: str, password: str, *, address: str) -> AccountRecord:
        """The account, when ``password`` is its password and it is enabled; SignInRefused otherwise. Either way an
        audit event (``console.signin`` or ``console.signin_refused``) names the account and the client's address."""
        try:
            account = await self._master.accounts.sign_in(account_id, password)
        except SignInRefused as exc:
            await self._master.events.record("console.signin_refused", account_id[:64], address=address, reason=str(exc))
            raise
        await self._master.events.record("console.signin", account.id, address=address)
        return account

    async def record_audit(self, entry: AuditEntry) -> None:
        await self._master.events.record(
            "audit",
            entry.account,
            key_id=entry.key_id,
            role=entry.role,
            method=entry.method,
            route=entry.route,
            target=entry.target,
            status=entry.status,
        )

    # --- agents --------------------------------------------------------------------------------

    def _detail(self, agent: AgentRecord, hosted: dict[str, list[HostedReplica]] | None = None) -> AgentDetail:
        m = self._master
        gpus = m.registry.gpus_of(agent.id)
        offered = frozenset(g.uuid for g in gpus if m.offered(g))
        replicas = (hosted if hosted is not None else self._hosted({agent.id})).get(agent.id, [])
        return AgentDetail(agent, gpus, m.telemetry.latest, agent.id in m.hub.agent_links, offered, replicas, self._holders(gpus))

    def _hosted(self, agent_ids: set[str]) -> dict[str, list[HostedReplica]]:
        """The replicas of open workloads placed on these agents (whose containers are not yet deleted), oldest
        workload first. One pass over the open workloads in memory: a page of agents costs one, not one per agent."""
        found: dict[str, list[HostedReplica]] = {}
        for rec in self.workloads.open_workloads():
            for a in rec.assignments:
                if a.agent_id in agent_ids and a.state != "deleted":
                    found.setdefault(a.agent_id, []).append(
                        HostedReplica(
                            workload_id=rec.id,
                            name=rec.spec.name,
                            image=rec.spec.image,
                            replica=a.replica,
                            units=list(a.units),
                            container=a.container,
                            state=rec.state,
                            container_state=a.state,
                            started_at=rec.started_at,
                        )
                    )
        return found

    def _holders(self, gpus: Iterable[GpuRecord]) -> dict[str, str]:
        """GPU and MIG instance uuid -> the container holding it, for the GPUs given."""
        allocations = self._master.allocations
        found: dict[str, str] = {}
        for gpu in gpus:
            for uuid in (gpu.uuid, *(m.uuid for m in gpu.info.mig_instances)):
                hold = allocations.holder(uuid)
                if hold is not None:
                    found[uuid] = hold.container
        return found

    def _owned_agent(self, agent_id: str, owner: str | None) -> AgentRecord:
        agent = self._master.registry.get(agent_id)
        if owner is not None and agent.provider != owner:
            raise NotFound(f"no agent {agent_id!r}")  # the same answer as a missing one: existence is not leaked
        return agent

    def get_agent(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        return self._detail(self._owned_agent(agent_id, owner))

    def list_agents(
        self,
        *,
        state: str | None = None,
        provider: str | None = None,
        region: str | None = None,
        tier: str | None = None,
        model: str | None = None,
        owner: str | None = None,
        after: AgentKey | None = None,
        limit: int,
    ) -> Page[AgentDetail]:
        """Hosts by id from the cursor on; a host matches ``tier`` (``model``) when one of its GPUs is of it. A page walks
        the ids until it has ``limit + 1`` hosts."""
        registry = self._master.registry
        found: list[AgentRecord] = []
        for agent_id in self._ids_after(after.id if after else None, strictly=True):
            agent = registry.agents[agent_id]
            if (
                (state is not None and agent.state != state)
                or (region is not None and agent.region != region)
                or (provider is not None and agent.provider != provider)
                or (owner is not None and agent.provider != owner)
            ):
                continue
            if tier is not None or model is not None:
                gpus = registry.gpus_of(agent_id)
                if tier is not None and not any(g.tier == tier for g in gpus):
                    continue
                if model is not None and not any(g.model == model for g in gpus):
                    continue
            found.append(agent)
            if len(found) > limit:
                break
        page = _page(found, limit, lambda a: AgentKey(a.id))
        hosted = self._hosted({a.id for a in page.items})
        return Page([self._detail(a, hosted) for a in page.items], page.next_key)

    def _ids_after(self, agent_id: str | None, *, strictly: bool) -> Iterator[str]:
        """Agent ids in order, from ``agent_id`` on. Sorting 10,000 ids takes about a millisecond: cheaper than
        keeping a sorted index in step with the registry, which this façade is not told about."""
        ids = sorted(self._master.registry.agents)
        start = 0
        if agent_id is not None:
            start = (bisect.bisect_right if strictly else bisect.bisect_left)(ids, agent_id)
        return iter(ids[start:])

    async def drain(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        self._owned_agent(agent_id, owner)
        return self._detail(await self._master.drain(agent_id))

    async def undrain(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        self._owned_agent(agent_id, owner)
        return self._detail(await self._master.undrain(agent_id))

    async def revoke(self, agent_id: str) -> AgentDetail:
        return self._detail(await self._master.revoke(agent_id))

    # --- GPUs ----------------------------------------------------------------------------------

    def list_gpus(
        self,
        *,
        state: str | None = None,
        tier: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        offered: bool | None = None,
        owner: str | None = None,
        after: GpuKey | None = None,
        limit: int,
    ) -> Page[GpuDetail]:
        """GPUs ordered by (agent id, index, uuid). Walks the agents in id order from the cursor's agent and each
        agent's few GPUs, so a page costs one sort of agent ids and ``limit`` GPUs, never a sort of every GPU."""
        registry = self._master.registry
        start = after
        if agent_id is not None:
            wanted = agent_id in registry.agents and (start is None or agent_id >= start.agent_id)
            ids: Iterator[str] = iter([agent_id] if wanted else [])
        else:
            ids = self._ids_after(start.agent_id if start else None, strictly=False)
        found: list[GpuRecord] = []
        for aid in ids:
            if owner is not None and registry.agents[aid].provider != owner:
                continue
            for gpu in registry.gpus_of(aid):
                if start is not None and (gpu.agent_id, gpu.index, gpu.uuid) <= (start.agent_id, start.index, start.uuid):
                    continue
                if (
                    (state is None or gpu.state == state)
                    and (tier is None or gpu.tier == tier)
                    and (model is None or gpu.model == model)
                    and (offered is None or self._master.offered(gpu) == offered)
                ):
                    found.append(gpu)
            if len(found) > limit:
                break
        page = _page(found, limit, lambda g: GpuKey(g.agent_id, g.index, g.uuid))
        latest = self._master.telemetry.latest
        return Page(
            [GpuDetail(g, latest.get(g.uuid), self._master.offered(g), self._holders([g])) for g in page.items], page.next_key
        )

    async def repair_gpu(self, uuid: str) -> GpuDetail:
        """Clear a faulty GPU's fault (master/faults.py): NotFound for an unknown GPU, Conflict for one not faulty."""
        gpu = await self._master.repair_gpu(uuid)
        return GpuDetail(gpu, self._master.telemetry.latest.get(gpu.uuid), self._master.offered(gpu), self._holders([gpu]))

    def list_tiers(self, *, after: PositionKey | None = None, limit: int) -> Page[dict[str, Any]]:
        """Tiers in the policy's order (the order is meaningful: best first); the key is the position."""
        tiers = describe_tiers(self._master.policy)
        start = after.position + 1 if after else 0
        window = tiers[start : start + limit + 1]
        page = _page(list(enumerate(window, start)), limit, lambda t: PositionKey(t[0]))
        return Page([t for _, t in page.items], page.next_key)

    # --- commands ------------------------------------------------------------------------------

    async def create_command(self, agent_id: str, kind: str, spec: dict[str, Any], *, timeout_s: float | None) -> CommandRecord:
        return await self._master.create_command(agent_id, kind, spec, timeout_s=timeout_s)

    async def get_command(self, command_id: str) -> CommandRecord:
        return await self._master.command(command_id)

    async def list_commands(
        self,
        *,
        agent_id: str | None = None,
        states: list[str] | None = None,
        after: CommandKey | None = None,
        limit: int,
    ) -> Page[CommandRecord]:
        """Newest first, by (created_at, id) descending. New commands are created at the head, so they never shift
        a page that is under way; a deep page reads the store from the head to its position (see docs/api.md)."""
        start = (after.created_at, after.id) if after else None
        window = limit + 1 + (after.depth if after else 0)
        while True:
            records = await self._master.commands(agent_id=agent_id, states=states, limit=window)
            older = [r for r in records if start is None or (r.created_at, r.id) < start]
            if len(older) > limit or len(records) < window:
                break
            window *= COMMAND_WINDOW_GROWTH
        skipped = len(records) - len(older)
        return _page(older[: limit + 1], limit, lambda r: CommandKey(r.created_at, r.id, skipped + limit))

    # --- events --------------------------------------------------------------------------------

    async def list_events(
        self, *, subject: str | None = None, kind: str | None = None, after_seq: int = 0, limit: int
    ) -> Page[EventRecord]:
        events = await self._master.events_after(subject=subject, kind_prefix=kind, after_seq=after_seq, limit=limit + 1)
        return _page(events, limit, lambda e: SeqKey(e.seq))

    # --- join tokens ---------------------------------------------------------------------------

    async def create_token(self, provider: str, ttl_s: float | None) -> IssuedToken:
        token, record = await self._master.create_token(provider, ttl_s)
        return IssuedToken(token, record)

    # --- command-signing keys ------------------------------------------------------------------

    def list_signing_keys(self, *, after: PositionKey | None = None, limit: int) -> Page[SigningKeyInfo]:
        """Newest first, as the key ring describes them; the key is the position in that order (keys are few and
        only ever added, at the head, so a rotation during paging repeats at most one key)."""
        keys = self._master.authority.keys.describe()
        start = after.position + 1 if after else 0
        page = _page(list(enumerate(keys[start : start + limit + 1], start)), limit, lambda k: PositionKey(k[0]))
        return Page([k for _, k in page.items], page.next_key)

    async def rotate_signing_key(self) -> SigningKeyInfo:
        return await self._master.rotate_signing_key()

    async def retire_signing_key(self, key_id: str) -> SigningKeyInfo:
        return await self._master.retire_signing_key(key_id)

    # --- health and metrics --------------------------------------------------------------------

    def health(self) -> Health:
        leadership = self._master.leadership
        return Health(
            store=self._master.store.backend,
            relays=sorted(self._master.hub.links),
            role=self._master.role,
            ready=self._master.serves(),
            leader=leadership.leader_api_url() if leadership is not None else "",
        )

    # --- workloads -----------------------------------------------------------------------------
    # ``account``: the renter account a call is limited to (auth.Scope.owner), None for the operator.

    async def submit_workload(self, account: str, spec: WorkloadSpec) -> WorkloadRecord:
        await self.workloads.load()
        await self.market.admit(account, spec)  # money before work: 402 with the figures
        return await self.workloads.submit(account, spec, time.time())

    async def get_workload(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        await self.workloads.load()
        return await self.workloads.get(workload_id, account=account)

    async def list_workloads(
        self,
        *,
        account: str | None = None,
        states: list[str] | None = None,
        owner: str | None = None,
        after: WorkloadKey | None = None,
        limit: int,
    ) -> Page[WorkloadRecord]:
        """Newest first (by creation time, then id); a page continues strictly after the last one's key. ``owner``
        limits it to one account whatever ``account`` asks (another account's filter finds nothing)."""
        if owner is not None:
            if account is not None and account != owner:
                return Page([], None)
            account = owner
        await self.workloads.load()
        found = await self.workloads.list(account=account, states=states, before=after.listed if after else None, limit=limit + 1)
        return _page(found, limit, lambda w: WorkloadKey(workload_order(w.created_at, w.id)))

    async def workload_and_wait(
        self, workload_id: str, *, account: str | None = None
    ) -> tuple[WorkloadRecord, Explanation | None]:
        """The workload and, while it is queued, why it waits."""
        record = await self.get_workload(workload_id, account=account)
        if record.state != "queued":
            return record, None
        try:
            return record, await self.scheduler.explain(workload_id)
        except NotFound:  # placed or cancelled between the two reads
            return await self.get_workload(workload_id, account=account), None

    async def explain_workload(self, workload_id: str, *, account: str | None = None) -> Explanation:
        """Why a queued workload waits, constraint by constraint; Conflict for one that does not wait."""
        record = await self.get_workload(workload_id, account=account)
        if record.state != "queued":
            raise Conflict(f"workload {workload_id} is {record.state} ({record.state_reason}); only a queued workload waits")
        return await self.scheduler.explain(workload_id)

    async def workload_outputs(self, workload_id: str) -> list[KeptOutput]:
        """The output kept of a workload's deleted containers, by replica then attempt (the caller has checked who may
        see the workload)."""
        kept = await self._master.store.outputs.list(workload_id=workload_id)
        return sorted(kept, key=lambda k: (k.replica, k.attempt))

    async def cancel_workload(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        await self.workloads.load()
        return await self.workloads.cancel(workload_id, account, time.time())

    # --- the console's composite reads (management/console/) --------------------------------------------------------

    @property
    def console_settings(self) -> ConsoleSettings:
        return self._master.config.console

    @property
    def state_path(self) -> Path:
        """The Master's state directory (the console keeps its session key there)."""
        return self._master.config.state_path

    WORKLOAD_EVENTS_SHOWN = 200
    SPEND_ENTRIES_READ = 10_000  # ledger lines a spend chart reads at most (the newest)
    SPEND_BUCKETS_SHOWN = 24 * 31  # a month of hours

    async def workload_overview(self, workload_id: str, *, account: str | None = None) -> WorkloadOverview:
        """The workload (NotFound for another account's), why it waits, its terms, events, rentals and charge."""
        record, explanation = await self.workload_and_wait(workload_id, account=account)
        events = await self._master.events_after(subject=workload_id, kind_prefix=None, after_seq=0, limit=10_000)
        rentals, _ = await self.market.list_rentals(
            owner=None, role="operator", workload=workload_id, agent_id=None, open_only=False, after=None, limit=100
        )
        return WorkloadOverview(
            workload=record,
            explanation=explanation,
            terms=self.market.workload_terms(record),
            events=events[-self.WORKLOAD_EVENTS_SHOWN :],
            rentals=rentals,
            charged=sum(r.charged for r in rentals),
            currency=self.market.currency,
            outputs=await self.workload_outputs(workload_id),
        )

    async def billing_overview(self, account_id: str, *, owner: str | None, after_seq: int, limit: int) -> BillingOverview:
        """The balance, spend over time and the ledger page after ``after_seq`` of ``account_id`` (NotFound for
        another account's, as ``owner`` decides)."""
        return BillingOverview(
            funds=await self.market.funds(account_id, owner=owner),
            spend=await self.spend_over_time(account_id, owner=owner),
            statement=await self.market.ledger_statement(account_id, owner=owner, after_seq=after_seq, limit=limit),
        )

    async def spend_over_time(self, account_id: str, *, owner: str | None, bucket_s: float = 3600.0) -> SpendOverTime:
        """What a renter spent per ``bucket_s`` (charges less refunds, from its ledger statement), oldest first."""
        after, lines = 0, list[StatementLine]()
        while True:
            statement = await self.market.ledger_statement(account_id, owner=owner, after_seq=after, limit=1000)
            lines.extend(line for line in statement.lines if line.kind != "credit")
            if not statement.more or len(lines) >= self.SPEND_ENTRIES_READ:
                break
            after = statement.next_after
        spent: dict[int, int] = {}
        for line in lines[-self.SPEND_ENTRIES_READ :]:
            bucket = int(line.ts // bucket_s)
            spent[bucket] = spent.get(bucket, 0) - line.amount
        points: list[SpendPoint] = []
        if spent:
            first, last = min(spent), max(max(spent), int(time.time() // bucket_s))
            first = max(first, last - self.SPEND_BUCKETS_SHOWN + 1)
            points = [SpendPoint(b * bucket_s, spent.get(b, 0)) for b in range(first, last + 1)]
        return SpendOverTime(account_id, self.market.currency, bucket_s, points, sum(p.spent for p in points))

    # --- the market: providers' prices (management/market/prices.py) ---------------------------------------------
    # ``owner`` (as auth decided it): the provider a call acts for, None for the operator. A host of another provider
    # answers NotFound, as a missing one does. The price in force on a host is public: ``host_price`` takes no owner.

    def _provider_of(self, agent_id: str) -> str | None:
        agent = self._master.registry.agents.get(agent_id)
        return agent.provider if agent is not None else None

    async def list_prices(self, *, owner: str | None = None, provider: str | None = None) -> PriceListing:
        """A provider's own records (its default and its hosts'), or the operator's view of all (of ``provider``)."""
        await self.prices.load()
        if owner is not None:
            if provider is not None and provider != owner:
                raise NotFound(f"no provider {provider!r}")
            provider = owner
        return PriceListing(self.prices.records(provider), self.prices.grid_default, self._master.config.currency)

    async def set_default_price(self, provider: str, setting: PriceSetting) -> PriceRecordDetail:
        """``provider``'s default for its hosts without a price of their own (an enabled provider account)."""
        await self._master.accounts.require_provider(provider)
        await self.prices.load()
        return PriceRecordDetail(await self.prices.set_default(provider, setting), self._master.config.currency)

    async def set_host_price(self, agent_id: str, setting: PriceSetting, *, owner: str | None = None) -> HostPriceDetail:
        agent = self._owned_agent(agent_id, owner)
        await self.prices.load()
        await self.prices.set_host(agent.provider, agent.id, setting)
        return self._host_price(agent)

    async def clear_host_price(self, agent_id: str, *, owner: str | None = None) -> HostPriceDetail:
        """The host goes back to its provider's default (or the grid's); clearing a host with no price of its own
        changes nothing and answers the price in force as well."""
        agent = self._owned_agent(agent_id, owner)
        await self.prices.load()
        await self.prices.clear_host(agent.provider, agent.id)
        return self._host_price(agent)

    async def host_price(self, agent_id: str) -> HostPriceDetail:
        await self.prices.load()
        return self._host_price(self._master.registry.get(agent_id))

    def _host_price(self, agent: AgentRecord) -> HostPriceDetail:
        price = self.prices.price(agent.provider, agent.id)
        return HostPriceDetail(agent.id, agent.provider, price, self._master.config.currency)

    # --- the console: the fleet at a glance, hosts filtered by their GPUs, live samples (management/console/) ----------

    def fleet(self) -> FleetFigures:
        """Compute-unit figures of the whole fleet by tier, region and model, and its faulty GPUs (management/fleet.py):
        one pass over the registry in memory."""
        m = self._master
        order = [rule.name for rule in m.policy.tiers]
        return fleet_figures(m.registry.gpus.values(), m.registry.agents, m.telemetry.latest, tier_order=order)

    def host_choices(self, *, owner: str | None = None) -> HostChoices:
        """What the hosts list may be filtered by: the regions, tiers and models present (of ``owner``'s hosts)."""
        registry = self._master.registry
        regions: set[str] = set()
        models: set[str] = set()
        for agent in registry.agents.values():
            if owner is None or agent.provider == owner:
                if agent.region:
                    regions.add(agent.region)
        for gpu in registry.gpus.values():
            if gpu.model and (owner is None or self._provider_of(gpu.agent_id) == owner):
                models.add(gpu.model)
        return HostChoices(
            regions=sorted(regions), tiers=[rule.name for rule in self._master.policy.tiers], models=sorted(models)
        )

    def recent_samples(self, agent_id: str, *, owner: str | None = None) -> HostSamples:
        """The host's recent telemetry per GPU, oldest first, for live charts. Asking watches the host: from then on
        the Master keeps a short ring of its samples (master/telemetry.py, RecentSamples), for a while after the
        last ask; the first answer holds each GPU's latest sample."""
        agent = self._owned_agent(agent_id, owner)
        m = self._master
        gpus = m.registry.gpus_of(agent.id)
        latest = m.telemetry.latest
        m.telemetry.recent.watch(agent.id, time.time(), [latest[g.uuid] for g in gpus if g.uuid in latest])
        return HostSamples(agent.id, gpus, m.telemetry.recent.of(agent.id))

    # --- telemetry history (management/monitoring/history.py) ---------------------------------------------------
    # ``owner`` (as auth decided it): a provider sees its own hosts' GPUs, a renter its own workloads; another
    # account's answers NotFound, as a missing one does.

    def _history_bounds(self, from_s: float | None, to_s: float | None, step_s: int | None) -> tuple[Window, int]:
        now = time.time()
        window = window_of(from_s, to_s, step_s, now=now)
        kept_since = int((now - self._master.config.history_minute_retention_s) // 60)
        return window, kept_since

    async def _gpu_series(self, gpu: GpuRecord, window: Window, kept_since: int) -> GpuSeries:
        points = await gpu_history(self._master.store, gpu.uuid, window, minutes_kept_since=kept_since)
        return GpuSeries(gpu.uuid, gpu.agent_id, points)

    async def gpu_telemetry(
        self, uuid: str, *, from_s: float | None, to_s: float | None, step_s: int | None, owner: str | None = None
    ) -> TelemetryHistory:
        """One GPU's history over the window, at the step."""
        gpu = self._master.registry.gpus.get(uuid)
        if gpu is None or (owner is not None and self._provider_of(gpu.agent_id) != owner):
            raise NotFound(f"no GPU {uuid!r}")
        window, kept_since = self._history_bounds(from_s, to_s, step_s)
        series = [await self._gpu_series(gpu, window, kept_since)]
        return TelemetryHistory("gpu", uuid, window, resolution_of(window, minutes_kept_since=kept_since), series)

    async def host_telemetry(
        self, agent_id: str, *, from_s: float | None, to_s: float | None, step_s: int | None, owner: str | None = None
    ) -> TelemetryHistory:
        """Every GPU of one host, a series each; the host's own readings (CPU, memory, disk, network) at the same
        step, and its latest sample of itself."""
        agent = self._owned_agent(agent_id, owner)
        window, kept_since = self._history_bounds(from_s, to_s, step_s)
        series = [await self._gpu_series(g, window, kept_since) for g in self._master.registry.gpus_of(agent.id)]
        resolution = resolution_of(window, minutes_kept_since=kept_since)
        host_latest = self._master.telemetry.latest_hosts.get(agent.id)
        host_points = await host_history(self._master.store, agent.id, window, minutes_kept_since=kept_since)
        return TelemetryHistory("host", agent.id, window, resolution, series, host_latest=host_latest, host_points=host_points)

    async def workload_telemetry(
        self,
        workload_id: str,
        *,
        from_s: float | None,
        to_s: float | None,
        step_s: int | None,
        account: str | None = None,
    ) -> TelemetryHistory:
        """The GPUs a workload ran on over its life, one series per GPU and run, each cut to the run: its rentals
        (every run that started), and the placement it holds now if no open rental covers it yet."""
        workload = await self.get_workload(workload_id, account=account)
        window, kept_since = self._history_bounds(from_s, to_s, step_s)
        runs: list[tuple[str, str, float | None, float | None]] = []  # (agent id, unit, since, until)
        rentals = await self._master.store.rentals.list(workload_id=workload.id)
        for rental in rentals:
            runs += [(h.agent_id, unit, rental.started_at, rental.ended_at) for h in rental.hosts for unit in h.units]
        if not any(r.ended_at is None for r in rentals):
            since = workload.started_at or workload.scheduled_at
            runs += [(a.agent_id, unit, since, workload.finished_at) for a in workload.assignments for unit in a.units]
        series = []
        for agent_id, unit, since, until in runs:
            gpu = self._gpu_of_unit(agent_id, unit)
            part = window.clamped(since, until)
            if gpu is None or part is None:
                continue
            points = await gpu_history(self._master.store, gpu.uuid, part, minutes_kept_since=kept_since)
            series.append(GpuSeries(gpu.uuid, agent_id, points, unit=unit, since=since, until=until))
        resolution = resolution_of(window, minutes_kept_since=kept_since)
        return TelemetryHistory("workload", workload.id, window, resolution, series)

    def _gpu_of_unit(self, agent_id: str, unit: str) -> GpuRecord | None:
        """The GPU a unit (a GPU uuid, or a MIG instance's) is on, among the host's GPUs."""
        for gpu in self._master.registry.gpus_of(agent_id):
            if gpu.uuid == unit or any(m.uuid == unit for m in gpu.info.mig_instances):
                return gpu
        return None

    async def list_revocations(self) -> list[RevocationRecord]:
        """Every revoked certificate with its host and why, newest first (revocations are few: kept whole)."""
        found = await self._master.store.revocations.list()
        return sorted(found, key=lambda r: (r.revoked_at, r.serial), reverse=True)

    # --- monitoring: reports (management/monitoring/reports.py) ------------------------------------------------------

    async def report(
        self,
        kind: str,
        by: tuple[str, ...],
        start: float,
        end: float,
        *,
        provider: str | None = None,
        renter: str | None = None,
    ) -> tuple[Report, str]:
        """The report and the grid's currency, as ``provider`` (its hosts' rows) or ``renter`` (its rentals') sees it;
        neither: the operator's, every row."""
        report = await self.reports.report(kind, by, start, end, provider=provider, renter=renter)
        return report, self._master.config.currency

    # --- alerts: rules, alerts, silences, webhooks (management/monitoring/) ------------------------------------------
    # ``owner``/``role`` as auth decided: None and "operator" see everything; a provider or renter its own.

    async def alert_rules(self) -> list[RuleListing]:
        return await self.alert_settings.rules()

    async def put_alert_rule(self, name: str, spec: dict[str, Any], *, by: str) -> AlertRule:
        return await self.alert_settings.put_rule(name, spec, by)

    async def delete_alert_rule(self, name: str) -> RuleListing | None:
        return await self.alert_settings.delete_rule(name)

    async def list_alerts(
        self, *, owner: str | None, role: str, rule: str | None = None, phase: str | None = None, severity: str | None = None
    ) -> AlertListing:
        viewer = Viewer(account=owner or "", role="operator" if owner is None else role)
        return await self.alert_settings.alerts(viewer, rule=rule, phase=phase, severity=severity)

    async def create_silence(
        self,
        *,
        by: str,
        duration_s: float,
        rule: str | None = None,
        subject: str | None = None,
        labels: Mapping[str, str] | None = None,
        comment: str = "",
    ) -> SilenceRecord:
        return await self.alert_settings.create_silence(
            by=by, duration_s=duration_s, rule=rule, subject=subject, labels=labels or {}, comment=comment
        )

    async def list_silences(self, *, include_expired: bool = False) -> list[SilenceRecord]:
        return await self.alert_settings.silences(include_expired=include_expired)

    async def expire_silence(self, silence_id: str) -> SilenceRecord:
        return await self.alert_settings.expire_silence(silence_id)

    async def create_webhook(self, url: str, *, owner: str, role: str) -> WebhookRecord:
        return await self.alert_settings.create_webhook(url, owner=owner, role=role)

    async def list_webhooks(self, *, owner: str | None, after: WebhookKey | None = None, limit: int) -> Page[WebhookRecord]:
        after_key = None if after is None else (after.created_at, after.id)
        found = await self.alert_settings.webhooks(owner=owner, after=after_key, limit=limit + 1)
        return _page(found, limit, lambda w: WebhookKey(w.created_at, w.id))

    async def delete_webhook(self, webhook_id: str, *, owner: str | None) -> None:
        await self.alert_settings.delete_webhook(webhook_id, owner=owner)
