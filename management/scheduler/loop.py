"""The scheduling loop: snapshot, core, decisions carried out through the Master's commands. Small, named, restartable.

One cycle, always in this order:

1. **Reconcile** (level-triggered, like a Kubernetes controller): every open workload holding GPUs is compared with
   what the Master knows now: its create commands (acked, succeeded, failed, timed out), its containers on their hosts
   (exited with a code, gone), its maximum duration. Events only wake the loop; the facts are read here, so a change
   lost to a full feed, or made while this Master was down, is still acted on. A workload container a host runs
   that no open workload holds (its create ran after its delete: a host runs commands concurrently) is deleted again.
2. **Snapshot** the grid and the queue (management/scheduler/snapshot.py) and run the pure core
   (management/scheduler/core.py).
3. **Carry out** its decisions: ``Place`` records the assignment first (intent is stored before any command, so a
   Master killed in between finds the workload ``scheduled`` and issues what is missing) and then creates one container
   per replica; ``Preempt`` deletes the victim's containers with the policy's grace (SIGTERM, then SIGKILL) and marks it
   ``preempted``, requeued (or failed, by its restart policy) once its containers are gone; ``Requeue`` deletes what is
   left of it and puts it back in the queue at its original place; ``Reject`` fails it with the reason.

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
from typing import Any

import msgspec

from common.errors import IdlegridError, NotFound, is_renter_fault
from management.scheduler.book import WorkloadBook
from management.scheduler.core import explain, never_fits, schedule
from management.scheduler.model import DEFAULT_HALF_LIFE_S, Explanation, Place, Plan, Policy, Preempt, Reject, Requeue, Snapshot
from management.scheduler.snapshot import (
    HOLDING_STATES,
    PriceOf,
    UnitCache,
    build_snapshot,
    job_of,
    policy_of,
    workload_of,
)
from management.scheduler.usage import UsageMeter
from management.scheduler.usage_saving import UsageSaver
from management.scheduler.workloads import WorkloadState, container_name
from master.config import MasterConfig
from master.master import Master
from master.records import Assignment, CommandRecord, WorkloadRecord, WorkloadSpec
from master.states import AgentState, CommandState

log = logging.getLogger(__name__)

W = WorkloadState
_FAILED_COMMAND = frozenset({CommandState.FAILED.value, CommandState.TIMED_OUT.value, CommandState.CANCELLED.value})
_GONE_HOST = frozenset({AgentState.RETIRED.value, AgentState.QUARANTINED.value})
RESTARTING_POLICIES = frozenset({"on_failure", "always"})
EXPLAIN_SNAPSHOT_S = 1.0  # how long explanations reuse one snapshot of the grid
STRAY_RETRY_S = 30.0  # a stray container whose delete failed is tried again after this long


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
        master: Master,
        book: WorkloadBook,
        settings: SchedulerSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        prices: PriceOf | None = None,
        funded: Callable[[str], bool] | None = None,
        budget: Callable[[str], int] | None = None,
        period_s: float = 60.0,
    ) -> None:
        """``prices``: each host's prices in force, ``(provider, agent id) -> HostPrice`` (None: a free grid);
        ``funded``: whether a renter account has money available (None: every renter has); ``budget``: a renter's
        available balance, so work starts only where it pays one metering period of ``period_s`` (None: no limit)."""
        self.master = master
        self.prices = prices
        self.funded = funded
        self.budget = budget
        self.period_s = period_s
        self.book = book
        self.settings = settings or SchedulerSettings()
        self._clock = clock
        self.usage = UsageMeter(self.settings.half_life_s)
        self.usage_saver = UsageSaver(self.usage, master.store.fair_share, every_s=self.settings.usage_save_every_s)
        self.base_policy = Policy(
            half_life_s=self.settings.half_life_s,
            placement_default=self.settings.placement,  # type: ignore[arg-type]  # checked by the settings' user
            backfill=self.settings.backfill,
            allow_process_runtime=self.settings.allow_process_runtime,
            grace_s=self.settings.grace_s,
            metering_period_s=period_s,
        )
        self._units = UnitCache()  # each host's units, rebuilt only when its GPUs change
        self._strays: dict[tuple[str, str], float] = {}
        self._strays_swept_at = float("-inf")  # (host, container) -> when this loop last deleted it
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
        )
        self._units.forget_all_but(m.registry.agents)
        self.usage.advance(
            now, [snapshot.running[w.id] for w in holding if w.state == W.RUNNING.value and w.id in snapshot.running]
        )
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
            id="wl-0", account=account, spec=spec, state=W.QUEUED.value, state_reason="", created_at=now, queued_at=now
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
        if rec.state != W.QUEUED.value:
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
        # The intent is stored before any command: a Master killed after this line finds it and issues what is missing.
        rec = await self.book.transition(rec.id, "schedule", reason, now, assignments=assignments)
        await self._issue_creates(rec, now)
        return 1

    async def _issue_creates(self, rec: WorkloadRecord, now: float) -> WorkloadRecord:
        """Create every replica's container that has no create command yet; a refused create requeues the workload."""
        changed = False
        assignments = list(rec.assignments)
        for i, a in enumerate(assignments):
            if a.command_id:
                continue
            agent = self.master.registry.agents.get(a.agent_id)
            if agent is not None and a.container in agent.containers:  # created before a restart: adopt it
                assignments[i] = msgspec.structs.replace(a, state="running")
                changed = True
                continue
            made = self._create_made_for(a)
            if made:  # made by a Master that died before it noted the id here: that create is the one to wait for
                assignments[i] = msgspec.structs.replace(a, command_id=made)
                changed = True
                continue
            timeout_s = self.settings.start_timeout_s
            if agent is not None and rec.spec.image not in agent.images:
                timeout_s += self.settings.pull_allowance_s  # the host pulls the image first
            try:
                command = await self.master.create_command(
                    a.agent_id, "create_container", self._container_spec(rec, a), timeout_s=timeout_s
                )
            except IdlegridError as exc:
                if changed:
                    rec = await self.book.amend(rec.id, assignments=assignments)
                await self._requeue(rec.id, f"host {a.agent_id} refused the container: {exc}", now)
                return rec
            assignments[i] = msgspec.structs.replace(a, command_id=command.id)
            changed = True
        if changed:
            rec = await self.book.amend(rec.id, assignments=assignments)
        return rec

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

    def _container_spec(self, rec: WorkloadRecord, a: Assignment) -> dict[str, Any]:
        spec = rec.spec
        body: dict[str, Any] = {
            "name": a.container,
            "image": spec.image,
            "command": list(spec.command),
            "env": dict(spec.env),
            "gpus": list(a.units),
            "labels": dict(spec.labels),
            "workload_id": rec.id,
            "replica": a.replica,
        }
        if spec.ports:  # only then: an agent from before ports travelled here refuses a field it does not know
            body["ports"] = list(spec.ports)
        if spec.replica.cpu_cores is not None:
            body["cpus"] = spec.replica.cpu_cores
        if spec.replica.ram_mib is not None:
            body["memory_mib"] = spec.replica.ram_mib
        if spec.registry_auth is not None:
            body["registry_auth"] = msgspec.to_builtins(spec.registry_auth)
        return body

    async def _preempt(self, decision: Preempt, now: float) -> int:
        rec = await self.book.get(decision.job_id)
        if rec.state not in (W.SCHEDULED.value, W.STARTING.value, W.RUNNING.value):
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
        if rec.state not in (W.SCHEDULED.value, W.STARTING.value, W.RUNNING.value, W.PREEMPTED.value):
            return 0
        changes: dict[str, Any] = {} if restarts is None else {"restarts": restarts}
        if host_failure:
            changes["host_failure"] = host_failure
        await self.book.end(rec.id, "requeue", reason, now, grace_s=self.settings.grace_s, **changes)
        return 1

    # --- reconciling with what the Master knows ----------------------------------------------------------------

    async def reconcile(self, now: float) -> int:
        moved = 0
        for rec in self.book.open_workloads():
            try:
                if rec.state in (W.SCHEDULED.value, W.STARTING.value):
                    moved += await self._reconcile_start(rec, now)
                elif rec.state == W.RUNNING.value:
                    moved += await self._reconcile_running(rec, now)
                elif rec.state == W.PREEMPTED.value:
                    moved += await self._reconcile_preempted(rec, now)
            except (IdlegridError, ValueError) as exc:
                log.warning("workload %s not reconciled: %s", rec.id, exc)
        if now - self._strays_swept_at >= self.settings.stray_sweep_s or now < self._strays_swept_at:
            # A pass over every host's containers: at 10,000 hosts worth doing once a period, not on every wake-up.
            self._strays_swept_at = now
            moved += await self._delete_strays(now)
        return moved

    async def _delete_strays(self, now: float) -> int:
        """Delete again every workload container a host runs that no open workload holds and no delete is under way
        for: its create ran after its delete (a host runs commands concurrently, so a delete can find nothing yet),
        and it would otherwise hold its GPUs, and keep a preempted workload stopping, for ever."""
        held = {
            (a.agent_id, a.container)
            for rec in self.book.open_workloads()
            for a in rec.assignments
            if a.state not in ("deleting", "deleted")
        }
        deleting = {(c.agent_id, c.spec.get("name")) for c in self.master.commands.open.values() if c.kind == "delete_container"}
        issued = 0
        strays: set[tuple[str, str]] = set()
        for agent in self.master.registry.agents.values():
            if agent.state in _GONE_HOST or agent.state == AgentState.OFFLINE.value:
                continue
            for name in agent.containers:
                key = (agent.id, name)
                if workload_of(name) is None or key in held or key in deleting:
                    continue
                strays.add(key)
                if now - self._strays.get(key, now - STRAY_RETRY_S) < STRAY_RETRY_S:
                    continue
                self._strays[key] = now
                spec = {"name": name, "timeout_s": self.settings.grace_s}
                try:
                    await self.master.create_command(agent.id, "delete_container", spec)
                except IdlegridError as exc:
                    log.warning("stray container %s on %s not deleted: %s", name, agent.id, exc)
                    continue
                log.info("deleting a stray workload container", extra={"agent_id": agent.id, "container": name})
                issued += 1
        self._strays = {key: at for key, at in self._strays.items() if key in strays}  # gone ones are forgotten
        return issued

    async def _command(self, command_id: str) -> CommandRecord | None:
        if not command_id:
            return None
        try:
            return await self.master.command(command_id)
        except NotFound:
            return None

    async def _reconcile_start(self, rec: WorkloadRecord, now: float) -> int:
        if any(not a.command_id and a.state == "pending" for a in rec.assignments):
            rec = await self._issue_creates(rec, now)
            if rec.state not in (W.SCHEDULED.value, W.STARTING.value):
                return 1
        states = []
        failed_on: list[str] = []  # the hosts whose create failed, in replica order
        pulls: list[str] = []  # how the image pulls under way go, per replica still starting
        for a in rec.assignments:
            command = await self._command(a.command_id)
            state = "succeeded" if a.state == "running" else (command.state if command else "pending")
            states.append(state)
            if state in _FAILED_COMMAND:
                failed_on.append(a.agent_id)
                if command is not None and is_renter_fault(str((command.result or {}).get("error_code") or "")):
                    return await self._refused(rec, command, now)
            elif state != CommandState.SUCCEEDED.value and (pulling := self.master.pull_progress(a.agent_id, a.container)):
                pulls.append(pulling if len(rec.assignments) == 1 else f"replica {a.replica}: {pulling}")
        failed = [s for s in states if s in _FAILED_COMMAND]
        if failed:
            reason = f"{len(failed)} of {len(states)} container(s) did not start ({failed[0]})"
            return await self._failed(rec, reason, now, host_failure=f"{failed_on[0]}: container did not start ({failed[0]})")
        if all(s == CommandState.SUCCEEDED.value for s in states):
            if rec.state == W.SCHEDULED.value:
                rec = await self.book.transition(rec.id, "start", "containers created", now)
            assignments = [msgspec.structs.replace(a, state="running") for a in rec.assignments]
            await self.book.transition(rec.id, "run", f"{len(assignments)} container(s) running", now, assignments=assignments)
            return 1
        if rec.state == W.SCHEDULED.value and any(s in (CommandState.ACKED.value, CommandState.SUCCEEDED.value) for s in states):
            await self.book.transition(rec.id, "start", "hosts acknowledged", now)
            return 1
        detail = "; ".join(pulls)
        if detail != rec.detail:
            await self.book.amend(rec.id, detail=detail)
            return 1
        return 0

    async def _refused(self, rec: WorkloadRecord, command: CommandRecord, now: float) -> int:
        """A container did not start because of the renter's request (no such image, credentials refused, too large,
        a bad command: common.errors.RENTER_FAULT_CODES): the workload fails with the host's words, at once (a
        restart would fail the same way), and no host is blamed (no ``host_failure``, no reputation loss)."""
        code = str((command.result or {}).get("error_code") or "")
        reason = f"did not start ({code}): {command.error or 'no reason given'}"
        event = "fail" if rec.state == W.RUNNING.value else "start_failed"
        await self.book.end(rec.id, event, reason, now, grace_s=0.0)
        return 1

    async def _reconcile_running(self, rec: WorkloadRecord, now: float) -> int:
        codes: list[int] = []
        lost: list[str] = []
        through: list[str] = []  # "<agent id>: why", per lost replica
        for a in rec.assignments:
            agent = self.master.registry.agents.get(a.agent_id)
            if agent is None or agent.state in _GONE_HOST:
                lost.append(f"host {a.agent_id} is gone")
                why = "retired or quarantined" if agent is not None else "left the grid"
                through.append(f"{a.agent_id}: host is gone ({why})")
                continue
            code = agent.exited.get(a.container)
            if code is not None:
                codes.append(code)
            elif a.container not in agent.containers and agent.state != AgentState.OFFLINE.value:
                lost.append(f"container {a.container} vanished from {a.agent_id}")
                through.append(f"{a.agent_id}: container {a.container} vanished")
        if lost:
            return await self._requeue(rec.id, "; ".join(lost), now, host_failure=through[0])
        if any(code != 0 for code in codes):
            bad = next(code for code in codes if code != 0)
            return await self._failed(rec, f"a container exited with code {bad}", now, exit_codes=codes)
        if len(codes) == len(rec.assignments):
            if rec.spec.restart_policy == "always" and rec.restarts < rec.spec.max_restarts:
                return await self._requeue(
                    rec.id, "all containers exited 0; restart_policy always", now, restarts=rec.restarts + 1
                )
            await self.book.end(rec.id, "succeed", "all containers exited 0", now, grace_s=0.0, exit_codes=codes)
            return 1
        started = rec.started_at or rec.scheduled_at or rec.queued_at
        if rec.spec.max_duration_s is not None and now - started > rec.spec.max_duration_s:
            reason = f"ran past its max_duration_s ({rec.spec.max_duration_s:g} s)"
            await self.book.end(rec.id, "fail", reason, now, grace_s=self.settings.grace_s)
            return 1
        return 0

    async def _reconcile_preempted(self, rec: WorkloadRecord, now: float) -> int:
        for a in rec.assignments:
            agent = self.master.registry.agents.get(a.agent_id)
            if (
                agent is not None
                and agent.state not in _GONE_HOST | {AgentState.OFFLINE.value}
                and a.container in agent.containers
            ):
                return 0  # still stopping
        for_job = rec.preempted_for or "a higher priority workload"
        if rec.spec.restart_policy in RESTARTING_POLICIES:
            await self.book.transition(rec.id, "requeue", f"preempted for {for_job}; back in the queue", now)
        else:
            await self.book.transition(rec.id, "fail", f"preempted for {for_job}; restart_policy never", now)
        return 1

    async def _failed(
        self, rec: WorkloadRecord, reason: str, now: float, *, exit_codes: list[int] | None = None, host_failure: str = ""
    ) -> int:
        """A replica failed: restart (back to the queue) while the restart policy allows, otherwise fail.
        ``host_failure`` ("<agent id>: why"): it failed through that host (a container that did not start there)."""
        extra: dict[str, Any] = {} if exit_codes is None else {"exit_codes": exit_codes}
        if host_failure:
            extra["host_failure"] = host_failure
        if rec.spec.restart_policy in RESTARTING_POLICIES and rec.restarts < rec.spec.max_restarts:
            restarts = rec.restarts + 1
            why = f"{reason}; restart {restarts} of {rec.spec.max_restarts}"
            return await self._requeue(rec.id, why, now, restarts=restarts, host_failure=host_failure)
        event = "fail" if rec.state == W.RUNNING.value else "start_failed"
        await self.book.end(rec.id, event, reason, now, grace_s=0.0, **extra)
        return 1
