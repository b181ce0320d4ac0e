"""The workload runner: the I/O shell around the scheduler core and the lifecycle step. Small, named, restartable.

It decides nothing itself: the core (management/scheduler/core.py) decides placement, the lifecycle step
(management/workloads/lifecycle.py) decides everything else; this module reads the facts, calls them and carries out
what they return through the workload book and the Master's commands. One cycle, always in this order:

1. **Reconcile** (level-triggered, like a Kubernetes controller): for every open workload holding GPUs the runner
   reads what the Master knows now (its create commands, its containers on their hosts, their exits: ``facts``),
   calls ``lifecycle.step`` and carries out its actions. Events only wake the loop; the facts are read here, so a
   change lost to a full feed, or made while this Master was down, is still acted on. Once a sweep period it also
   deletes again the workload containers nobody holds (``lifecycle.strays``).
2. **Snapshot** the grid and the queue (management/scheduler/snapshot.py) and run the pure core.
3. **Carry out** its decisions: ``Place`` records the assignment first (intent is stored before any command, so a
   Master killed in between finds the workload ``scheduled`` and issues what is missing) and then creates one container
   per replica (the step's ``Create`` actions); ``Preempt`` deletes the victim's containers with the policy's grace
   (SIGTERM, then SIGKILL) and marks it ``preempted``; ``Requeue`` deletes what is left of it and puts it back in the
   queue at its original place; ``Reject`` fails it with the reason.

The loop runs when something that can change the answer happens (a workload submitted, cancelled or back in the queue;
a GPU's health, a host's state, a container's exit, a container command's end: master/changes.py) and on a timer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from common.containers import DeleteSpec
from common.errors import IdlegridError, NotFound
from common.nebula import decode_cert_pem, fingerprint
from common.overlay import MAX_BLOCKLIST, OverlaySpec
from management.scheduler.core import explain, never_fits, schedule
from management.scheduler.model import DEFAULT_HALF_LIFE_S, Explanation, Place, Plan, Policy, Preempt, Reject, Requeue, Snapshot
from management.scheduler.snapshot import (
    PriceOf,
    UnitCache,
    build_snapshot,
    job_of,
    policy_of,
)
from management.scheduler.usage import UsageMeter
from management.scheduler.usage_saving import UsageSaver
from management.store import fair_share_repo
from management.workloads import lifecycle
from management.workloads.book import WorkloadBook
from management.workloads.lifecycle import (
    Action,
    Adopt,
    Advance,
    End,
    Facts,
    HostContainers,
    HostStatus,
    LifecyclePolicy,
    Note,
    ReplicaFacts,
    TakeOver,
)
from management.workloads.spec import InvalidWorkloadSpec, container_name, container_spec, new_worker_token
from management.workloads.states import HOLDING_STATES, AssignmentState, WorkloadChanges, WorkloadState
from management.workloads.storage import container_storage, secret_names
from master.port import AgentRecord, AgentState, Assignment, CommandRecord, MasterConfig, MasterPort, WorkloadRecord, WorkloadSpec

log = logging.getLogger(__name__)

W = WorkloadState
EXPLAIN_SNAPSHOT_S = 1.0  # how long explanations reuse one snapshot of the grid
OVERLAY_ISSUED_KEPT = MAX_BLOCKLIST  # a workload's overlay certificates remembered (a blocklist holds as many)


class SchedulerSettings(msgspec.Struct, frozen=True, kw_only=True):
    period_s: float = 5.0  # a cycle at least this often, even when nothing woke the loop
    settle_s: float = 0.05  # after a wake-up, wait this long so a burst of changes makes one cycle
    min_gap_s: float = 0.25  # and never start a cycle sooner than this after the last one ended
    stray_sweep_s: float = 5.0  # look for workload containers nobody holds (a pass over every host) this often
    grace_s: float = 30.0  # a preempted or cancelled container gets this long between SIGTERM and SIGKILL
    offline_grace_s: float = 20.0  # a host unseen this long has its workloads placed elsewhere
    start_timeout_s: float = 300.0  # a container create that has not finished by then failed
    pull_allowance_s: float = 1800.0  # ... plus this on a host that does not list the image as one it has
    half_life_s: float = DEFAULT_HALF_LIFE_S
    placement: str = "binpack"
    backfill: bool = True
    allow_process_runtime: bool = False
    usage_save_every_s: float = 60.0  # fair-share usage is saved to the store at most this often, and when the loop stops

    @classmethod
    def of(cls, config: MasterConfig) -> SchedulerSettings:
        """The settings a Master's configuration gives (master/config.py documents each)."""
        return cls(
            period_s=config.scheduler_period_s,
            grace_s=config.preemption_grace_s,
            offline_grace_s=config.requeue_offline_after_s,
            start_timeout_s=config.command_timeout_s,
            pull_allowance_s=config.image_pull_allowance_s,
            half_life_s=config.fair_share_half_life_s,
            placement=config.placement,
            allow_process_runtime=config.offer_sandboxed_hosts,
        )


@dataclass(frozen=True, slots=True)
class CycleReport:
    placed: int
    preempted: int
    requeued: int
    rejected: int
    reconciled: int
    seconds: float


class SchedulerLoop:
    def __init__(
        self,
        master: MasterPort,
        book: WorkloadBook,
        settings: SchedulerSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        prices: PriceOf | None = None,
        funded: Callable[[str], bool] | None = None,
        budget: Callable[[str], int] | None = None,
        period_s: float = 60.0,
        capped: Callable[[str, str], str] | None = None,
        under_review: Callable[[str], bool] | None = None,
    ) -> None:
        """``prices``: each host's prices in force, ``(provider, agent id) -> HostPrice`` (None: a free grid);
        ``funded``: whether a renter account has money available (None: every renter has); ``budget``: a renter's
        available balance, so work starts only where it pays one metering period of ``period_s`` (None: no limit);
        ``capped``: which hard spend cap keeps an (account, project) from new paid work ("" for none; None: no caps)."""
        self.master = master
        self.prices = prices
        self.funded = funded
        self.budget = budget
        self.capped = capped
        self.under_review = under_review  # hosts under review for their completion rate take no new work
        self.period_s = period_s
        self.book = book
        self.settings = settings or SchedulerSettings()
        self._clock = clock
        self.usage = UsageMeter(self.settings.half_life_s)
        self.usage_saver = UsageSaver(self.usage, fair_share_repo(master.store), every_s=self.settings.usage_save_every_s)
        self.base_policy = Policy(
            half_life_s=self.settings.half_life_s,
            placement_default=self.settings.placement,  # type: ignore[arg-type]  # checked by the settings' user
            backfill=self.settings.backfill,
            allow_process_runtime=self.settings.allow_process_runtime,
            grace_s=self.settings.grace_s,
            metering_period_s=period_s,
        )
        self.lifecycle_policy = LifecyclePolicy(
            grace_s=self.settings.grace_s,
            start_timeout_s=self.settings.start_timeout_s,
            pull_allowance_s=self.settings.pull_allowance_s,
        )
        self._units = UnitCache()  # each host's units, rebuilt only when its GPUs change
        self._strays: dict[tuple[str, str], float] = {}  # (host, container) -> when this loop last deleted it
        self._strays_swept_at = float("-inf")
        self._explain_snapshot: tuple[float, Snapshot] | None = None  # (monotonic time taken, snapshot)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self.cycles = 0
        self.last: CycleReport | None = None
        book.subscribe(self._on_book_change)

    def _on_book_change(self, _what: str, _rec: WorkloadRecord) -> None:
        self._explain_snapshot = None  # the queue changed: an explanation must see it
        self._wake.set()

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        subscription = self.master.changes.subscribe()

        async def pump() -> None:
            async for _change in subscription:
                self._wake.set()

        self._pump = asyncio.create_task(pump(), name="scheduler-changes")
        self._task = asyncio.create_task(self._run(), name="scheduler")
        self._wake.set()

    async def stop(self) -> None:
        ran = self._task is not None
        for task in (self._task, self._pump):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._task = self._pump = None
        if ran:
            await self.usage_saver.flush(self._clock())

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        await self.usage_saver.load(self._clock())  # fair share goes on from the saved usage, decayed across the downtime
        while True:
            # asyncio.timeout, not wait_for: wait_for's inner task, cancelled together with this one when the process
            # shuts down (asyncio.run cancels every task at once), left this task waiting for ever on Python 3.11.
            try:
                async with asyncio.timeout(self.settings.period_s):
                    await self._wake.wait()
                await asyncio.sleep(self.settings.settle_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling cycle failed; the next one runs in %.1f s", self.settings.period_s)
            self.usage_saver.tick(self._clock())
            # A snapshot of a large grid costs real CPU: however often changes arrive, cycles are at least this far
            # apart, and a long cycle is followed by twice its length, so the loop takes at most a third of the
            # Master's time (its relay links and API share the same event loop).
            took = self.last.seconds if self.last is not None else 0.0
            await asyncio.sleep(max(self.settings.min_gap_s, 2 * took))

    # --- one cycle ------------------------------------------------------------------------------------------

    async def cycle(self) -> CycleReport:
        started = time.perf_counter()
        now = self._clock()
        reconciled = await self.reconcile(now)
        counts = (0, 0, 0, 0)
        if self.book.counts():  # with no open workload there is nothing to place, move or stop: no snapshot
            snapshot = await self.snapshot(now)
            plan = schedule(snapshot, explain=False)
            counts = await self.carry_out(plan, now)
        self.cycles += 1
        self.last = CycleReport(*counts, reconciled=reconciled, seconds=time.perf_counter() - started)
        if counts[0] or counts[1] or counts[2]:
            log.info(
                "scheduling cycle",
                extra={"placed": counts[0], "preempted": counts[1], "requeued": counts[2], "rejected": counts[3]},
            )
        return self.last

    async def snapshot(self, now: float) -> Snapshot:
        m = self.master
        workloads = self.book.open_workloads()
        holding = [w for w in workloads if w.state in HOLDING_STATES and w.assignments]
        accounts = await m.accounts.list(limit=100_000)
        policy = policy_of(accounts, base=self.base_policy)
        snapshot = build_snapshot(
            now=now,
            agents=m.registry.agents,
            gpus_by_agent={agent_id: m.registry.gpus_of(agent_id) for agent_id in m.registry.agents},
            holds=m.allocations.holds(),
            workloads=workloads,
            usage={},
            project_usage={},
            policy=policy,
            offline_grace_s=self.settings.offline_grace_s,
            listening_since=m.started_at,
            unit_cache=self._units,
            prices=self.prices,
            funded=self.funded,
            budget=self.budget,
            period_s=self.period_s,
            capped=self.capped,
            under_review=self.under_review,
        )
        self._units.forget_all_but(m.registry.agents)
        self.usage.advance(now, [snapshot.running[w.id] for w in holding if w.state == W.RUNNING and w.id in snapshot.running])
        return dataclasses.replace(snapshot, usage=dict(self.usage.usage), project_usage=dict(self.usage.project_usage))

    async def never_fits(self, account: str, spec: WorkloadSpec) -> str | None:
        """Why a workload not yet submitted could never run on this grid as it is now, with what would fix it, or None
        (management/scheduler/core.py ``never_fits``); on the explain snapshot, as renters' submits can come often."""
        at = time.monotonic()
        cached = self._explain_snapshot
        if cached is None or at - cached[0] > EXPLAIN_SNAPSHOT_S:
            cached = self._explain_snapshot = (at, await self.snapshot(self._clock()))
        now = self._clock()
        rec = WorkloadRecord(
            id="wl-0", account=account, spec=spec, state=str(W.QUEUED), state_reason="", created_at=now, queued_at=now
        )
        return never_fits(cached[1], job_of(rec))

    async def explain(self, workload_id: str) -> Explanation:
        """Why a queued workload waits, constraint by constraint (management/scheduler/core.py ``explain``). A snapshot
        is reused for ``EXPLAIN_SNAPSHOT_S`` (and until a workload is submitted, cancelled or moves): at 10,000 hosts
        it costs a sixth of a second, and renters poll."""
        at = time.monotonic()
        cached = self._explain_snapshot
        if cached is None or at - cached[0] > EXPLAIN_SNAPSHOT_S:
            cached = self._explain_snapshot = (at, await self.snapshot(self._clock()))
        return explain(cached[1], workload_id)

    # --- carrying out the core's decisions ------------------------------------------------------------------

    async def carry_out(self, plan: Plan, now: float) -> tuple[int, int, int, int]:
        placed = preempted = requeued = rejected = 0
        for decision in plan.decisions:
            try:
                if isinstance(decision, Place):
                    placed += await self._place(decision, now)
                elif isinstance(decision, Preempt):
                    preempted += await self._preempt(decision, now)
                elif isinstance(decision, Requeue):
                    requeued += await self._requeue(
                        decision.job_id, decision.reason, now, host_failure=await self._failed_host(decision)
                    )
                elif isinstance(decision, Reject):
                    await self.book.transition(decision.job_id, "reject", decision.reason, now)
                    rejected += 1
            except (IdlegridError, ValueError) as exc:
                log.warning("scheduling decision not carried out: %s", exc, extra={"decision": repr(decision)})
        return placed, preempted, requeued, rejected

    async def _place(self, decision: Place, now: float) -> int:
        rec = await self.book.get(decision.job_id)
        if rec.state != W.QUEUED:
            return 0
        attempt = rec.attempts + 1
        assignments = []
        for replica, units in enumerate(decision.assignment):
            gpu = self.master.registry.gpu_of_unit(units[0])  # a whole GPU, or the GPU a MIG instance splits
            if gpu is None:
                raise NotFound(f"GPU {units[0]} left the grid since the snapshot; {rec.id} is placed again next cycle")
            host = gpu.agent_id
            assignments.append(
                Assignment(replica=replica, agent_id=host, units=list(units), container=container_name(rec.id, replica, attempt))
            )
        hosts = sorted({a.agent_id for a in assignments})
        reason = f"placed on {', '.join(hosts)}"
        network = rec.network or self._gang_network(rec)
        # The intent is stored before any command: a Master killed after this line finds it and issues what is missing.
        rec = await self.book.transition(rec.id, "schedule", reason, now, assignments=assignments, network=network)
        await self.advance(rec, now)  # its creates (lifecycle.step: each replica's Create)
        return 1

    def _gang_network(self, rec: WorkloadRecord) -> str:
        """A block of the overlay for a gang placed the first time (docs/overlay.md); kept while the workload is open,
        so its replicas keep their addresses across restarts and moves. "" for one replica, a gang that asked for no
        network, or with the overlay off."""
        if rec.spec.replicas < 2 or rec.spec.network == "none":
            return ""
        return self.master.overlay_network([r.network for r in self.book.open_workloads() if r.network])

    def _create_made_for(self, a: Assignment) -> str:
        """The id of the create command that holds ``a``'s GPUs for its container, "" when none does. One exists when a
        Master made it and was killed before it stored the id on the workload (the ledger rebuilds its holds from the
        open creates). Another create would take those holds over (the first, already on its way, would then run
        holding nothing) and the host would refuse it as a name clash, failing the workload."""
        for uuid in a.units:
            hold = self.master.allocations.holder(uuid)
            if hold is not None and hold.command_id and (hold.agent_id, hold.container) == (a.agent_id, a.container):
                return hold.command_id
        return ""

    async def _preempt(self, decision: Preempt, now: float) -> int:
        rec = await self.book.get(decision.job_id)
        if rec.state not in (W.SCHEDULED, W.STARTING, W.RUNNING):
            return 0
        await self.book.end(
            rec.id, "preempt", decision.reason, now, grace_s=self.settings.grace_s, preempted_for=decision.for_job
        )
        return 1

    async def _failed_host(self, decision: Requeue) -> str:
        """``WorkloadRecord.host_failure`` for a core ``Requeue`` (every one ends a run through a host): "<agent>: why".
        A unit that left the grid has no host in the snapshot: the workload's assignment names it."""
        host = decision.host
        if not host:
            rec = await self.book.get(decision.job_id)
            gone = [a.agent_id for a in rec.assignments if any(self.master.registry.gpu_of_unit(u) is None for u in a.units)]
            host = gone[0] if gone else (rec.assignments[0].agent_id if rec.assignments else "")
        return f"{host}: {decision.reason}" if host else ""  # no host to name (it held nothing): not set

    async def _requeue(
        self, workload_id: str, reason: str, now: float, *, restarts: int | None = None, host_failure: str = ""
    ) -> int:
        """Back to the queue; ``host_failure`` ("<agent id>: why") when the run ended through a host."""
        rec = await self.book.get(workload_id)
        if rec.state not in HOLDING_STATES:
            return 0
        changes = WorkloadChanges() if restarts is None else WorkloadChanges(restarts=restarts)
        if host_failure:
            changes["host_failure"] = host_failure
        await self.book.end(rec.id, "requeue", reason, now, grace_s=self.settings.grace_s, **changes)
        return 1

    # --- reconciling with what the Master knows ----------------------------------------------------------------

    async def reconcile(self, now: float) -> int:
        moved = 0
        for rec in self.book.open_workloads():
            if rec.state not in HOLDING_STATES:
                continue
            try:
                moved += await self.advance(rec, now)
            except (IdlegridError, ValueError) as exc:
                log.warning("workload %s not reconciled: %s", rec.id, exc)
        if now - self._strays_swept_at >= self.settings.stray_sweep_s or now < self._strays_swept_at:
            # A pass over every host's containers: at 10,000 hosts worth doing once a period, not on every wake-up.
            self._strays_swept_at = now
            moved += await self._delete_strays(now)
        return moved

    async def advance(self, rec: WorkloadRecord, now: float) -> int:
        """Read ``rec``'s facts, step it, carry out the actions in order; 1 when anything was done, else 0."""
        actions = lifecycle.step(rec, await self.facts(rec), self.lifecycle_policy, now)
        for action in actions:
            rec = await self._carry(rec, action, now)
            if rec.state not in HOLDING_STATES:
                break  # a refused create requeued it: what followed was for the run that ended
        return 1 if actions else 0

    async def facts(self, rec: WorkloadRecord) -> Facts:
        """What the Master knows now about each of ``rec``'s replicas (lifecycle.ReplicaFacts)."""
        replicas = []
        for a in rec.assignments:
            agent = self.master.registry.agents.get(a.agent_id)
            pending = a.state == AssignmentState.PENDING  # its create's fate matters only until it runs
            command = await self._command(a.command_id) if pending else None
            result = (command.result or {}) if command is not None else {}
            replicas.append(
                ReplicaFacts(
                    host=_host_status(agent),
                    listed=agent is not None and a.container in agent.containers,
                    exit_code=None if agent is None else agent.exited.get(a.container),
                    create_state=command.state if command is not None else "",
                    create_error_code=str(result.get("error_code") or ""),
                    create_error=(command.error or "") if command is not None else "",
                    pulling=self.master.pull_progress(a.agent_id, a.container),
                    has_image=agent is None or rec.spec.image in agent.images,
                    create_made=self._create_made_for(a) if pending and not a.command_id else "",
                )
            )
        return Facts(tuple(replicas))

    async def _carry(self, rec: WorkloadRecord, action: Action, now: float) -> WorkloadRecord:
        """Carry out one of the step's actions (lifecycle.py lists them); returns the record as it is after it."""
        if isinstance(action, Advance):
            return await self.book.transition(rec.id, action.event, action.reason, now, **action.changes)
        if isinstance(action, End):
            return await self.book.end(rec.id, action.event, action.reason, now, grace_s=action.grace_s, **action.changes)
        if isinstance(action, Note):
            return await self.book.amend(rec.id, detail=action.detail)
        a = next(a for a in rec.assignments if a.replica == action.replica)
        if isinstance(action, Adopt):
            change = msgspec.structs.replace(a, state=str(AssignmentState.RUNNING))
        elif isinstance(action, TakeOver):
            change = msgspec.structs.replace(a, command_id=action.command_id)
        else:
            overlay = self.master.overlay_spec(
                workload_id=rec.id,
                network=rec.network,
                replica=a.replica,
                replicas=rec.spec.replicas,
                gpus=rec.spec.replica.gpus,
                agent_id=a.agent_id,
                now=now,
                max_duration_s=rec.spec.max_duration_s,
                blocklist=retired_certificates(rec),
                attempt=rec.attempts,
            )
            try:
                # The secrets it names, read now (a secret deleted since the submit fails the start: the renter's).
                secrets = await self.master.secrets.resolve(rec.account, secret_names(rec.spec))
                storage = container_storage(rec.spec, secrets, a.replica)
                password = self.master.secrets.unseal(rec.sealed_registry_password) if rec.sealed_registry_password else None
                # An endpoint worker's token, new for each create: the Master keeps it sealed in the stored command.
                token = new_worker_token() if rec.endpoint_worker is not None else ""
                spec = container_spec(
                    rec, a, overlay, secrets=secrets, storage=storage, registry_password=password, worker_token=token
                )
            except (NotFound, InvalidWorkloadSpec) as exc:
                unusable = End("start_failed", f"did not start: {exc}", self.lifecycle_policy.grace_s)
                return await self._carry(rec, unusable, now)
            try:
                command = await self.master.create_command(a.agent_id, spec, timeout_s=action.timeout_s)
            except IdlegridError as exc:
                refused = lifecycle.create_refused(rec, a.agent_id, str(exc), self.lifecycle_policy)
                return await self._carry(rec, refused, now)
            if overlay is None:
                change = msgspec.structs.replace(a, command_id=command.id)
            else:
                issued = overlay_fingerprint(overlay)
                change = msgspec.structs.replace(a, command_id=command.id, overlay_fingerprint=issued)
                assignments = [change if x.replica == a.replica else x for x in rec.assignments]
                kept = [*(f for f in rec.overlay_issued if f != issued), issued][-OVERLAY_ISSUED_KEPT:]
                return await self.book.amend(rec.id, assignments=assignments, overlay_issued=kept)
        assignments = [change if x.replica == a.replica else x for x in rec.assignments]
        return await self.book.amend(rec.id, assignments=assignments)

    async def _delete_strays(self, now: float) -> int:
        """Delete again every workload container nobody holds (lifecycle.strays says which and why)."""
        deleting = {
            (c.agent_id, str(c.spec.get("name"))) for c in self.master.commands.open.values() if c.kind == "delete_container"
        }
        # Only hosts with containers can hold a stray: at 100,000 mostly idle hosts, judging each one's status every
        # sweep was the largest timer-driven cost of the Master's loop (docs/capacity.md).
        hosts = [
            HostContainers(agent.id, _host_status(agent) == HostStatus.ANSWERING, agent.containers)
            for agent in self.master.registry.agents.values()
            if agent.containers
        ]
        deletes, self._strays = lifecycle.strays(self.book.open_workloads(), hosts, deleting, self._strays, now)
        issued = 0
        for stray in deletes:
            spec = DeleteSpec(name=stray.container, timeout_s=self.settings.grace_s)
            try:
                await self.master.create_command(stray.agent_id, spec)
            except IdlegridError as exc:
                log.warning("stray container %s on %s not deleted: %s", stray.container, stray.agent_id, exc)
                continue
            log.info("deleting a stray workload container", extra={"agent_id": stray.agent_id, "container": stray.container})
            issued += 1
        return issued

    async def _command(self, command_id: str) -> CommandRecord | None:
        if not command_id:
            return None
        try:
            return await self.master.command(command_id)
        except NotFound:
            return None


def _host_status(agent: AgentRecord | None) -> HostStatus:
    if agent is None:
        return HostStatus.LEFT
    if agent.state in (AgentState.RETIRED, AgentState.QUARANTINED):
        return HostStatus.RETIRED
    if agent.state == AgentState.OFFLINE:
        return HostStatus.OFFLINE
    return HostStatus.ANSWERING


def overlay_fingerprint(overlay: OverlaySpec) -> str:
    """The fingerprint Nebula knows a replica's certificate by (hex SHA-256), as its blocklist names it."""
    return fingerprint(decode_cert_pem(overlay.certificate)).hex()


def retired_certificates(rec: WorkloadRecord) -> list[str]:
    """The workload's overlay certificates that none of its current containers holds: those of earlier attempts and
    restarts, which a replica left on a lost host (or brought back by its agent's restart before the Master deletes
    it) still holds, valid, with the address of the replica that replaced it. The new creates' Nebulas refuse them."""
    current = {a.overlay_fingerprint for a in rec.assignments}
    return [issued for issued in rec.overlay_issued if issued not in current]
