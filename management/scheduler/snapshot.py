"""The grid as the scheduler core reads it: hosts, units and holds from the Master, jobs from the workload book.

Everything here is a translation from records to the core's frozen values (management/scheduler/model.py); it
reads memory only (the Master's registry and allocation ledger, the book's open workloads), so a snapshot of
10,000 hosts costs a pass over them and no store call. Which facts count is decided here:

- a host is ``online`` while it answers, and also while it was last seen less than ``offline_grace_s`` ago: a relay
  failover shows a host offline for a moment, which must not requeue its workloads. Silence is counted from when this
  Master began listening at the earliest (``listening_since``): after a restart the stored ``last_seen`` is as old as
  the outage (plus the heartbeat flush lag), time in which the Master, not the host, was silent;
- it ``takes_work`` only when ready or busy and not drained;
- a unit is ``healthy`` unless its GPU is faulty (an Xid, ECC errors, overheating: master/faults.py), reported by two
  hosts, or gone from its host's inventory;
- prices come from a ``prices`` callable (management/market/prices.py ``PriceTable.price``); without one the grid is
  free. A renter ``funded`` says has no available money takes only hosts that charge it nothing;
- a hold whose container belongs to no placed workload (an operator's raw container, or a workload's container still
  being deleted after a requeue) is held by a placeholder job that is never placed, moved or preempted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping

from management.market.money import affordable_price, parse_amount, period_cost
from management.market.prices import HostPrice
from management.scheduler.model import (
    DEFAULT_CLASSES,
    Constraints,
    Host,
    Job,
    Policy,
    PriorityClass,
    Quota,
    ReplicaRequest,
    Snapshot,
    Unit,
)
from management.workloads.states import HOLDING_STATES
from management.workloads.states import WorkloadState as W
from master.port import (
    DUPLICATE_UUID_FLAG,
    GPU_UNREACHABLE_FLAG,
    MEASURED_FLAGS,
    AccountRecord,
    AgentRecord,
    AgentState,
    GpuRecord,
    GpuState,
    Hold,
    WorkloadRecord,
    reputation,
)

_ANSWERING = frozenset({AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value})
_TAKES_WORK = frozenset({AgentState.READY.value, AgentState.BUSY.value})
_RUNTIMES = frozenset({"docker", "process", "simulated"})
_ISOLATIONS = frozenset({"container", "sandbox", "none"})
_NO_PEERS: frozenset[str] = frozenset()
FREE = HostPrice(on_demand=0, min_bid=0)  # a host of a free grid: everything costs 0, interruptible at any bid
_RENTAL_KINDS = frozenset({"on_demand", "interruptible", "reserved"})

PriceOf = Callable[[str, str], HostPrice]  # (provider, agent id) -> the host's prices in force
Funded = Callable[[str], bool] | Collection[str]  # an account -> whether it has money available (or the set that has)
Budget = Callable[[str], int]  # an account -> its available balance, micro-units
Capped = Callable[[str, str], str]  # (account, project) -> which hard spend cap keeps it from new work ("" for none)


def compute_capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 0, 0


def host_of(
    agent: AgentRecord, now: float, *, offline_grace_s: float, listening_since: float = 0.0, price: HostPrice | None = None
) -> Host:
    """The core's host; ``price`` None: it charges nothing (a free grid)."""
    price = price if price is not None else FREE
    answering = agent.state in _ANSWERING
    last_heard = max(agent.last_seen, listening_since)
    recently_seen = agent.state == AgentState.OFFLINE.value and now - last_heard < offline_grace_s
    info = agent.host
    runtime = agent.runtime if agent.runtime in _RUNTIMES else "docker"
    isolation = agent.isolation if agent.isolation in _ISOLATIONS else "none"
    return Host(
        id=agent.id,
        provider=agent.provider,
        region=agent.region,
        reputation=reputation(agent).score,
        bandwidth_mbps=info.bandwidth_mbps_down if info is not None else None,
        disk_free_gib=info.disk_free_gib if info is not None else None,
        cpu_cores=float(info.cpu_cores) if info is not None else 0.0,
        ram_mib=info.ram_mib if info is not None else 0,
        takes_work=agent.state in _TAKES_WORK and not agent.drained,
        online=answering or recently_seen,
        runtime=runtime,  # type: ignore[arg-type]  # checked against the literal's values above
        isolation=isolation,  # type: ignore[arg-type]
        image_source=agent.image_source,
        images=tuple(agent.images),  # what it can refuse (with an image_source), and warm hosts for endpoint workers
        price=price.on_demand,
        min_bid=price.min_bid,
        reserved_price=price.reserved,
        max_duration_s=price.max_duration_s,
    )


def units_of(gpus: Iterable[GpuRecord]) -> list[Unit]:
    """One host's GPUs as units, with NVLink peers resolved from PCI bus ids to unit ids on the same host.

    A GPU in MIG mode is its instances, never itself (CUDA runs only in the instances): see ``mig_units_of``."""
    gpus = list(gpus)
    by_bus = {g.info.pci_bus_id.lower(): g.uuid for g in gpus if g.info.pci_bus_id}
    units = []
    for gpu in gpus:
        peers = _NO_PEERS
        if gpu.info.nvlinks:
            peers = frozenset(
                by_bus[link.remote_pci_bus_id.lower()]
                for link in gpu.info.nvlinks
                if link.active and link.remote_pci_bus_id and link.remote_pci_bus_id.lower() in by_bus
            ) - {gpu.uuid}
        healthy = (
            gpu.state != GpuState.FAULTY.value
            and gpu.fault is None
            and DUPLICATE_UUID_FLAG not in gpu.flags
            and GPU_UNREACHABLE_FLAG not in gpu.flags
            and MEASURED_FLAGS.isdisjoint(gpu.flags)  # measured as less than it claims (master/verification.py)
        )
        if gpu.info.mig_enabled:
            units.extend(mig_units_of(gpu, healthy=healthy))
            continue
        units.append(
            Unit(
                id=gpu.uuid,
                host=gpu.agent_id,
                index=gpu.index,
                model=gpu.model,
                tier=gpu.tier,
                vram_mib=gpu.info.memory_total_mib,
                compute_capability=compute_capability(gpu.info.compute_capability),
                nvlink_peers=peers,
                healthy=healthy,
                vendor=gpu.info.vendor,
            )
        )
    return units


class UnitCache:
    """Each host's units, rebuilt only when one of its GPUs changed in a way a unit shows (a new inventory, state,
    fault, tier, model, the duplicate flag): a snapshot of 80,000 GPUs then costs a signature per GPU instead of a
    unit per GPU. The cached GpuInfo objects are kept alive with the entry, so their ids cannot be reused."""

    def __init__(self) -> None:
        self._hosts: dict[str, tuple[tuple[object, ...], list[Unit]]] = {}

    def units(self, agent_id: str, gpus: Iterable[GpuRecord]) -> list[Unit]:
        gpus = list(gpus)
        signature = tuple(
            (
                g.info,
                id(g.info),
                g.uuid,
                g.index,
                g.state,
                g.fault,
                g.tier,
                g.model,
                DUPLICATE_UUID_FLAG in g.flags,
                GPU_UNREACHABLE_FLAG in g.flags,
            )
            for g in gpus
        )
        cached = self._hosts.get(agent_id)
        if cached is not None and _same(cached[0], signature):
            return cached[1]
        units = units_of(gpus)
        self._hosts[agent_id] = (signature, units)
        return units

    def forget_all_but(self, agent_ids: Collection[str]) -> None:
        """Drop the hosts not in ``agent_ids`` (gone from the grid), once there are more cached than known."""
        if len(self._hosts) > len(agent_ids):
            self._hosts = {a: entry for a, entry in self._hosts.items() if a in agent_ids}


def _same(old: tuple[object, ...], new: tuple[object, ...]) -> bool:
    """Signatures compared with GpuInfo by identity (a new inventory is a new object), everything else by value."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        assert isinstance(a, tuple) and isinstance(b, tuple)
        if a[1:] != b[1:]:
            return False
    return True


def mig_units_of(gpu: GpuRecord, *, healthy: bool) -> list[Unit]:
    """A GPU in MIG mode as units: one per instance (its profile, its own memory, the GPU as ``parent``), none while
    it is not partitioned. An instance is as healthy as its GPU (a fault takes every instance down) and has no
    NVLink peers (MIG instances do not do peer-to-peer)."""
    return [
        Unit(
            id=instance.uuid,
            host=gpu.agent_id,
            index=gpu.index,
            model=gpu.model,
            tier=gpu.tier,
            vram_mib=instance.memory_mib,
            compute_capability=compute_capability(gpu.info.compute_capability),
            mig_profile=instance.profile,
            parent=gpu.uuid,
            healthy=healthy,
            vendor=gpu.info.vendor,
        )
        for instance in gpu.info.mig_instances
    ]


def job_of(
    rec: WorkloadRecord, *, funded: bool = True, affordable: int | None = None, balance: int | None = None, capped: str = ""
) -> Job:
    """The core's job for a workload; ``funded`` False: its renter has no available money (only free hosts);
    ``affordable``: the most per GPU-hour its renter's balance pays for one metering period of it (None: no limit);
    ``capped``: which hard spend cap of its renter's is reached ("" for none: only free hosts otherwise)."""
    spec = rec.spec
    terms = spec.rental
    rental = terms.kind if terms is not None and terms.kind in _RENTAL_KINDS else "on_demand"
    replica = spec.replica
    holding = rec.state in HOLDING_STATES and rec.assignments
    assignment = tuple(tuple(a.units) for a in sorted(rec.assignments, key=lambda a: a.replica)) if holding else None
    return Job(
        id=rec.id,
        account=rec.account,
        project=spec.project,
        priority=spec.priority,
        submitted_at=rec.queued_at,
        replicas=spec.replicas,
        request=ReplicaRequest(
            gpus=replica.gpus,
            min_vram_mib=replica.min_vram_mib,
            models=frozenset(replica.models),
            vendors=frozenset(replica.vendors),
            tiers=frozenset(replica.tiers),
            min_compute_capability=compute_capability(replica.min_compute_capability) if replica.min_compute_capability else None,
            cpu_cores=replica.cpu_cores or 0.0,
            ram_mib=replica.ram_mib or 0,
            mig_profile=replica.mig_profile,
        ),
        constraints=Constraints(
            regions=frozenset(spec.constraints.regions),
            min_reputation=spec.constraints.min_reputation,
            min_bandwidth_mbps=spec.constraints.min_bandwidth_mbps or None,
            min_disk_gib=spec.constraints.min_disk_gib or None,
            nvlink=spec.constraints.nvlink,
            allow_process_runtime=spec.constraints.allow_process_runtime,
        ),
        max_duration_s=spec.max_duration_s,
        placement=spec.placement,  # type: ignore[arg-type]  # the spec allows only the literal's values
        started_at=(rec.started_at or rec.scheduled_at or rec.queued_at) if holding else None,
        assignment=assignment,
        preempted_for=(rec.preempted_for or "(stopping)") if rec.state == W.PREEMPTED else None,
        runs_image=spec.runs_image,
        image=spec.image,
        avoid=frozenset(rec.start_failed_on),
        prefer_warm=rec.endpoint_worker is not None,
        rental=rental,  # type: ignore[arg-type]  # checked against the literal's values above
        bid=parse_amount(terms.bid) if terms is not None and terms.bid is not None else 0,
        max_price=parse_amount(terms.max_price) if terms is not None and terms.max_price is not None else None,
        pin=_pin(rec, rental),
        funded=funded,
        capped=capped,
        affordable=affordable,
        balance=balance,
        reserved_s=terms.reserved_s if terms is not None else None,
    )


def _pin(rec: WorkloadRecord, rental: str) -> str | None:
    """The one host a rental of an offer runs on. A checkpointed interruptible rental whose host was lost may resume
    on any host its bid meets (its bid bounds what it pays; docs/market.md); an on-demand one waits for its host."""
    terms = rec.spec.rental
    if terms is None or terms.offer is None:
        return None
    if rental == "interruptible" and rec.spec.checkpoint is not None and rec.host_failure.startswith(f"{terms.offer}:"):
        return None
    return terms.offer


def policy_of(
    accounts: Iterable[AccountRecord],
    *,
    base: Policy,
) -> Policy:
    """The policy with every renter account's share, project shares and quotas."""
    shares: dict[str, float] = {}
    project_shares: dict[tuple[str, str], float] = {}
    quotas: dict[str, Quota] = {}
    for account in accounts:
        shares[account.id] = account.share
        for project, weight in account.project_shares.items():
            project_shares[(account.id, project)] = weight
        if account.gpu_quota is not None or account.tier_quotas:
            quotas[account.id] = Quota(gpus=account.gpu_quota, per_tier=dict(account.tier_quotas))
    return Policy(
        classes=base.classes,
        aging_step_s=base.aging_step_s,
        aging_max_boost=base.aging_max_boost,
        half_life_s=base.half_life_s,
        shares=shares,
        project_shares=project_shares,
        quotas=quotas,
        placement_default=base.placement_default,
        backfill=base.backfill,
        allow_process_runtime=base.allow_process_runtime,
        grace_s=base.grace_s,
        max_places_per_cycle=base.max_places_per_cycle,
        max_considered_per_cycle=base.max_considered_per_cycle,
        max_preemption_attempts_per_cycle=base.max_preemption_attempts_per_cycle,
        metering_period_s=base.metering_period_s,
    )


def _first_periods_placed(workloads: Iterable[WorkloadRecord], hosts: Mapping[str, Host], period_s: float) -> dict[str, int]:
    """Per account, the first metering period of its work placed but not running yet (scheduled, starting): no rental
    holds money for it yet, and a balance that pays one job's first period must not start twenty-eight."""
    committed: dict[str, int] = {}
    for rec in workloads:
        if rec.state not in (W.SCHEDULED, W.STARTING):
            continue
        job = job_of(rec)
        for a in rec.assignments:
            host = hosts.get(a.agent_id)
            if host is None:
                continue
            price = job.bid if job.rental == "interruptible" else host.reserved_price if job.rental == "reserved" else host.price
            committed[rec.account] = committed.get(rec.account, 0) + period_cost(price, max(1, len(a.units)), period_s)
    return committed


def classes_named(names: Iterable[str]) -> tuple[PriorityClass, ...]:
    """The default classes in the order given (every name must be one of them)."""
    known = {c.name: c for c in DEFAULT_CLASSES}
    return tuple(known[name] for name in names)


def build_snapshot(
    *,
    now: float,
    agents: Mapping[str, AgentRecord],
    gpus_by_agent: Mapping[str, Iterable[GpuRecord]],
    holds: Mapping[str, Hold],
    workloads: Iterable[WorkloadRecord],
    usage: Mapping[str, float],
    project_usage: Mapping[tuple[str, str], float],
    policy: Policy,
    offline_grace_s: float,
    listening_since: float = 0.0,
    unit_cache: UnitCache | None = None,
    prices: PriceOf | None = None,
    funded: Funded | None = None,
    budget: Budget | None = None,
    period_s: float = 60.0,
    capped: Capped | None = None,
    under_review: Callable[[str], bool] | None = None,
) -> Snapshot:
    """The core's snapshot. ``listening_since``: when this Master started (a host's silence is not counted before it).
    ``prices``: each host's prices in force (None: everything is free); ``funded``: which renters have money available
    (None: all of them); ``budget``: each renter's available balance, so that a queued job is placed only where it
    pays one metering period (``period_s``) of its GPUs (None: no such limit); ``capped``: which hard spend cap
    keeps a renter's project from new work that costs money ("" for none; None: no caps); ``under_review``: hosts
    whose completion rate put them under review (docs/disputes.md): they take no new work until an operator reviews
    them, and what runs there goes on."""
    hosts: dict[str, Host] = {}
    units: dict[str, Unit] = {}
    for agent in agents.values():
        if agent.state == AgentState.RETIRED.value:
            continue
        price = prices(agent.provider, agent.id) if prices is not None else None
        host = host_of(agent, now, offline_grace_s=offline_grace_s, listening_since=listening_since, price=price)
        if under_review is not None and host.takes_work and under_review(agent.id):
            host = dataclasses.replace(host, takes_work=False)
        hosts[agent.id] = host
        gpus = gpus_by_agent.get(agent.id, ())
        for unit in unit_cache.units(agent.id, gpus) if unit_cache is not None else units_of(gpus):
            units[unit.id] = unit
    running: dict[str, Job] = {}
    queue: list[Job] = []
    containers: dict[tuple[str, str], str] = {}  # (agent, container) -> the holding workload's id
    has_money: Callable[[str], bool] | None
    if funded is None or callable(funded):
        has_money = funded
    else:
        has_money = funded.__contains__
    workloads = list(workloads)
    committed = _first_periods_placed(workloads, hosts, period_s) if budget is not None else {}
    for rec in workloads:
        if rec.state == W.QUEUED:
            asked = rec.spec.replicas * rec.spec.replica.gpus
            balance = budget(rec.account) - committed.get(rec.account, 0) if budget is not None else None
            affordable = affordable_price(balance, asked, period_s) if balance is not None else None
            funds = has_money(rec.account) if has_money is not None else True
            cap = capped(rec.account, rec.spec.project) if capped is not None else ""
            queue.append(job_of(rec, funded=funds, affordable=affordable, balance=balance, capped=cap))
        elif rec.state in HOLDING_STATES and rec.assignments:
            running[rec.id] = job_of(rec, funded=has_money(rec.account) if has_money is not None else True)
            for a in rec.assignments:
                containers[(a.agent_id, a.container)] = rec.id
    instances: dict[str, list[str]] = {}  # a GPU in MIG mode -> its instances' unit ids
    for unit in units.values():
        if unit.parent is not None:
            instances.setdefault(unit.parent, []).append(unit.id)
    holders = {}
    for uuid, hold in holds.items():
        holder = containers.get((hold.agent_id, hold.container)) or f"container:{hold.agent_id}/{hold.container}"
        if uuid in units:
            holders[uuid] = holder
        for instance in instances.get(uuid, ()):  # a GPU in MIG mode held whole: every instance is taken
            holders.setdefault(instance, holder)
    # A placed workload's units that the ledger does not (yet, or any more) hold are still its own to the core.
    for job in running.values():
        for replica in job.assignment or ():
            for uuid in replica:
                if uuid in units:
                    holders.setdefault(uuid, job.id)
    return Snapshot(
        now=now,
        hosts=hosts,
        units=units,
        holders=holders,
        running=running,
        queue=queue,
        usage=dict(usage),
        project_usage=dict(project_usage),
        policy=policy,
    )
