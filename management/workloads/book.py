"""The workload book: the one writer of workload records, and the scheduler's in-memory view of the open ones.

It owns every write of a ``WorkloadRecord``. A write goes through the store with a version check
(``WorkloadRepo.update(expected_version=...)``), so a second writer (another Master on the same store)
that wrote first makes this write fail with ``StaleWorkload`` rather than be overwritten silently; every
state change is recorded as a ``workload.transition`` event. Open workloads (not succeeded, failed or
cancelled) are kept in memory, indexed by id, by state and by account; they are loaded from the store at
start, so a Master restart loses none. Final ones are read from the store when asked for.

Listeners: the scheduling loop waits on ``wakeup`` (an ``asyncio.Event`` set on every submit, cancel and
return to the queue; the loop clears it before it reads the queue), and/or registers a callback with
``subscribe``; callbacks are called synchronously after the write with ``(what, record)``, ``what`` one
of ``"submitted"``, ``"cancelled"`` or ``"transition"``, and must not block.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import secrets
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol, Unpack

import msgspec

from common.containers import CommandSpec, DeleteSpec
from common.egress import EgressRule
from common.errors import Conflict, IdlegridError, InvalidTransition, NotFound
from management.store import output_repo, workload_repo
from management.store.outputs import output_key
from management.store.workloads import workload_order
from management.workloads.spec import DEFAULT_PRIORITY_CLASSES, check_spec
from management.workloads.states import (
    FINAL_WORKLOAD_STATES,
    GONE_ASSIGNMENT_STATES,
    OPEN_WORKLOAD_STATES,
    WORKLOAD,
    AssignmentState,
    WorkloadChanges,
    WorkloadState,
)
from management.workloads.storage import check_storage, secret_names, stop_grace
from management.workloads.targets import check_targets
from master.port import (
    SEALED,
    Assignment,
    CommandRecord,
    EndpointWorkerRef,
    KeptOutput,
    ManagementStore,
    SecretShelf,
    TierPolicy,
    WorkloadRecord,
    WorkloadSpec,
)

log = logging.getLogger(__name__)

TRANSITION_EVENT = "workload.transition"
DELETE_REFUSED_EVENT = "workload.delete_refused"
BID_EVENT = "workload.bid"  # an interruptible workload's bid raised or lowered
DEFAULT_DELETE_GRACE_S = 30.0  # what a cancelled workload's containers get to stop before they are killed
MAX_STOP_GRACE_S = 600.0  # the most a workload's own stop_grace_s gives (a delete command's timeout_s bound)
UPLOAD_ALLOWANCE_S = 600.0  # a delete of a container with storage: its host's last upload (the agent's final_upload_s)
LOAD_PAGE = 1000
OPERATOR_EGRESS = EgressRule(who="the operator", setting="egress_allow in the Master's config")  # public only
# Fields a transition may not change: identity, what was asked, and what the book itself keeps.
_FIXED_FIELDS = frozenset(
    {"id", "account", "spec", "state", "state_reason", "created_at", "queued_at", "version", "endpoint_worker"}
)

Listener = Callable[[str, WorkloadRecord], None]


class BookMaster(Protocol):
    """What the book asks of the Master (``master.port.MasterPort`` is one): commands to hosts, its events, and
    ``secrets``: the renters' secrets, whose key seals a workload's registry password at submit."""

    @property
    def secrets(self) -> SecretShelf: ...

    async def create_command(self, agent_id: str, spec: CommandSpec, *, timeout_s: float | None = None) -> CommandRecord: ...
    async def record_event(self, kind: str, subject: str, /, **data: Any) -> None: ...


def new_workload_id() -> str:
    return "wl-" + secrets.token_hex(8)


class WorkloadBook:
    def __init__(
        self,
        store: ManagementStore,
        master: BookMaster,
        *,
        policy: TierPolicy,
        priority_classes: Collection[str] = DEFAULT_PRIORITY_CLASSES,
        delete_grace_s: float = DEFAULT_DELETE_GRACE_S,
        egress: EgressRule = OPERATOR_EGRESS,
        gang_overlay: bool = False,
    ) -> None:
        """``egress``: where a spec's storage endpoint and image registry may be (public, or the operator's
        ``egress_allow``), judged at every submit; ``gang_overlay``: whether the Master runs the gangs' overlay (its
        ``[overlay]`` lists lighthouses), without which a gang is taken only with ``network = "none"``."""
        self._store = store
        self._egress = egress
        self._gang_overlay = gang_overlay
        self._master = master
        self._policy = policy
        self._priority_classes = tuple(priority_classes)
        self._delete_grace_s = delete_grace_s
        self._open: dict[str, WorkloadRecord] = {}
        self._by_state: dict[str, set[str]] = defaultdict(set)
        self._by_account: dict[str, set[str]] = defaultdict(set)
        self._lock = asyncio.Lock()  # one write at a time: a transition never races this book's own other writes
        self._loaded = False
        self.wakeup = asyncio.Event()
        self._listeners: list[Listener] = []

    # --- start -------------------------------------------------------------------------------------------

    async def load(self) -> int:
        """Read every open workload from the store into memory (once; later calls do nothing); returns how many."""
        async with self._lock:
            if self._loaded:
                return len(self._open)
            before: str | None = None
            while True:
                page = await workload_repo(self._store).list(states=OPEN_WORKLOAD_STATES, before=before, limit=LOAD_PAGE)
                for rec in page:
                    self._index(await self._sealed(rec))
                if len(page) < LOAD_PAGE:
                    break
                last = page[-1]
                before = workload_order(last.created_at, last.id)
            self._loaded = True
            if self._open:
                self.wakeup.set()  # queued work from before the restart waits for the loop
            return len(self._open)

    async def _sealed(self, rec: WorkloadRecord) -> WorkloadRecord:
        """``rec`` with its registry password sealed in the store, when a Master older than sealing stored it in clear."""
        auth = rec.spec.registry_auth
        if auth is None or rec.sealed_registry_password or auth.password == SEALED:
            return rec
        spec = msgspec.structs.replace(rec.spec, registry_auth=msgspec.structs.replace(auth, password=SEALED))
        sealed = msgspec.structs.replace(
            rec, spec=spec, sealed_registry_password=self._master.secrets.seal(auth.password), version=rec.version + 1
        )
        try:
            await workload_repo(self._store).update(sealed, expected_version=rec.version)
        except Conflict:  # StaleWorkload
            return rec  # another Master wrote it first (and sealed it too): the next load reads theirs
        return sealed

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # --- reading -----------------------------------------------------------------------------------------

    async def get(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        """The workload; NotFound when missing or (with ``account``) owned by another account, alike."""
        rec = self._open.get(workload_id) or await workload_repo(self._store).get(workload_id)
        if rec is None or (account is not None and rec.account != account):
            raise NotFound(f"no workload {workload_id!r}")
        return rec

    async def list(
        self,
        *,
        account: str | None = None,
        states: Collection[str] | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> builtins.list[WorkloadRecord]:
        """Open and final workloads alike, newest first, from the store (which holds every write of this book)."""
        return await workload_repo(self._store).list(account=account, states=states, before=before, limit=limit)

    def open_workload(self, workload_id: str) -> WorkloadRecord | None:
        """An open workload as held in memory (no store read), None when it is not open."""
        return self._open.get(workload_id)

    def open_workloads(self, *, state: str | None = None, account: str | None = None) -> builtins.list[WorkloadRecord]:
        """Open workloads in memory, oldest submission first (``queued_at``, then id): the scheduler's FIFO."""
        ids: Iterable[str]
        if state is not None and account is not None:
            ids = self._by_state.get(state, set()) & self._by_account.get(account, set())
        elif state is not None:
            ids = self._by_state.get(state, set())
        elif account is not None:
            ids = self._by_account.get(account, set())
        else:
            ids = self._open
        return sorted((self._open[i] for i in ids), key=lambda w: (w.queued_at, w.id))

    def counts(self) -> dict[str, int]:
        """Open workloads by state."""
        return {state: len(ids) for state, ids in self._by_state.items() if ids}

    # --- writing -----------------------------------------------------------------------------------------

    async def check(self, account: str, spec: WorkloadSpec) -> None:
        """Refuse a spec ``account`` may not submit here, as submit does: what it names that is not configured, the
        secrets it names that the account lacks, the storage and registry the egress rule refuses. An endpoint's
        worker spec passes the same checks (management/services/endpoints.py)."""
        check_spec(spec, policy=self._policy, priority_classes=self._priority_classes, gang_overlay=self._gang_overlay)
        check_storage(spec, await self._master.secrets.names(account) if secret_names(spec) else ())
        await check_targets(spec, self._egress)

    async def submit(
        self, account: str, spec: WorkloadSpec, now: float, *, endpoint_worker: EndpointWorkerRef | None = None
    ) -> WorkloadRecord:
        """Store a new queued workload for ``account``; InvalidWorkloadSpec when it names what is not configured.
        ``endpoint_worker``: the endpoint and worker it is, given only by the endpoints' autoscaler (never by a renter:
        the workloads service has no such parameter; docs/endpoints.md, "The autoscaler's shell")."""
        await self.check(account, spec)
        spec = msgspec.structs.replace(spec, restart_policy=spec.restart_policy_in_force)  # answers state the one in force
        sealed_password = ""
        if spec.registry_auth is not None:  # stored sealed: the workload's record is in every backup and replica
            sealed_password = self._master.secrets.seal(spec.registry_auth.password)
            spec = msgspec.structs.replace(spec, registry_auth=msgspec.structs.replace(spec.registry_auth, password=SEALED))
        rec = WorkloadRecord(
            id=new_workload_id(),
            account=account,
            spec=spec,
            sealed_registry_password=sealed_password,
            state=str(WorkloadState.QUEUED),
            state_reason="submitted",
            created_at=now,
            queued_at=now,
            version=1,
            endpoint_worker=endpoint_worker,
        )
        async with self._lock:
            await workload_repo(self._store).insert(rec)
            self._index(rec)
            await self._record(rec, "", "submit", "submitted")
        self._notify("submitted", rec)
        return rec

    async def transition(
        self, workload_id: str, event: str, reason: str, now: float, **changes: Unpack[WorkloadChanges]
    ) -> WorkloadRecord:
        """Apply ``event`` to an open workload and store it; ``changes`` sets other fields on the way (e.g.
        ``assignments``). InvalidTransition when the table has no such move (or the workload is final),
        NotFound when there is no such workload, StaleWorkload when another writer changed it first."""
        async with self._lock:
            rec = await self._transition(workload_id, event, reason, now, changes)
        self._notify("transition", rec)
        return rec

    async def cancel(self, workload_id: str, account_scope: str | None, now: float) -> WorkloadRecord:
        """Cancel a workload from any open state. Its containers are deleted (a ``delete_container`` command per
        assignment, through the Master); the allocation ledger frees their GPUs once the deletes succeed.
        ``account_scope``: the caller's account (another account's workload is NotFound), None for an operator."""
        async with self._lock:
            rec = await self.get(workload_id, account=account_scope)
            if rec.state in FINAL_WORKLOAD_STATES:
                raise InvalidTransition(f"workload {workload_id} is already {rec.state}; there is nothing to cancel")
            who = "its owner" if account_scope is not None else "an operator"
            rec = await self._end(rec, "cancel", f"cancelled by {who}", now, grace_s=None, changes={})
        self._notify("cancelled", rec)
        return rec

    async def _end(
        self, rec: WorkloadRecord, event: str, reason: str, now: float, *, grace_s: float | None, changes: WorkloadChanges
    ) -> WorkloadRecord:
        """Store ``event`` with the live containers marked ``deleting``, THEN send their deletes: a Master killed in
        between leaves containers that no open workload holds (or holds as ``deleting``) with no delete under way,
        which the scheduling loop deletes again (``lifecycle.strays``); the other order could leave a
        workload the store still calls running whose containers are gone."""
        target = WORKLOAD.next(rec.state, event)
        live = [a for a in rec.assignments if a.container and a.state not in GONE_ASSIGNMENT_STATES]
        marked = [msgspec.structs.replace(a, state=str(AssignmentState.DELETING)) if a in live else a for a in rec.assignments]
        # Their output is awaited before the deletes go: a Master killed after the deletes still reads it from the
        # hosts when it is back (management/services/outputs.py), whatever becomes of the assignments (a requeue drops them).
        for a in live:
            await output_repo(self._store).put(pending_output(rec, a, now))
        if target != WorkloadState.QUEUED:
            changes = {"assignments": marked} | changes
        rec = await self._transition(rec.id, event, reason, now, changes)
        # A workload that asked for a longer (or shorter) grace to upload its checkpoint gets it (docs/storage.md).
        grace_s = stop_grace(rec.spec, self._delete_grace_s if grace_s is None else grace_s, MAX_STOP_GRACE_S)
        # ... and its delete waits for the last upload the host makes once the container stopped.
        timeout_s = grace_s + UPLOAD_ALLOWANCE_S if rec.spec.checkpoint or rec.spec.outputs else None
        refused = await self._delete_containers(rec.id, live, grace_s=grace_s, timeout_s=timeout_s)
        if refused:
            note = f"; {len(refused)} container(s) could not be deleted now: {'; '.join(refused)}"
            updated = msgspec.structs.replace(rec, state_reason=rec.state_reason + note, version=rec.version + 1)
            await workload_repo(self._store).update(updated, expected_version=rec.version)
            if rec.id in self._open:
                self._unindex(rec)
                self._index(updated)
            rec = updated
        return rec

    async def settle(self, workload_id: str, container: str, *, note: str = "") -> WorkloadRecord | None:
        """Mark ``container``'s assignment ``deleted`` (its delete is done and its output read or given up), on an
        open or a final workload; ``note`` is added to the reason (a failed workload's last lines of output). None
        when no assignment of the workload names that container in ``deleting`` (a requeue dropped it)."""
        async with self._lock:
            rec = self._open.get(workload_id) or await workload_repo(self._store).get(workload_id)
            if rec is None or not any(a.container == container and a.state == AssignmentState.DELETING for a in rec.assignments):
                return None
            assignments = [
                msgspec.structs.replace(a, state=str(AssignmentState.DELETED))
                if a.container == container and a.state == AssignmentState.DELETING
                else a
                for a in rec.assignments
            ]
            updated = msgspec.structs.replace(
                rec, assignments=assignments, state_reason=rec.state_reason + note, version=rec.version + 1
            )
            await workload_repo(self._store).update(updated, expected_version=rec.version)
            if rec.id in self._open:
                self._unindex(rec)
                self._index(updated)
            return updated

    async def amend(self, workload_id: str, **changes: Unpack[WorkloadChanges]) -> WorkloadRecord:
        """Store ``changes`` on an open workload without a state change (the loop notes its create commands' ids)."""
        async with self._lock:
            rec = self._open.get(workload_id)
            if rec is None:
                raise NotFound(f"no open workload {workload_id!r}")
            fixed = sorted(_FIXED_FIELDS & changes.keys())
            if fixed:
                raise ValueError(f"an amendment may not set {', '.join(fixed)}")
            updated = msgspec.structs.replace(rec, **changes, version=rec.version + 1)
            await workload_repo(self._store).update(updated, expected_version=rec.version)
            self._unindex(rec)
            self._index(updated)
            return updated

    async def change_bid(self, workload_id: str, bid: str, now: float) -> WorkloadRecord:
        """Store a new bid on an open interruptible workload's rental terms (the scheduler ranks and preempts by it);
        recorded as a ``workload.bid`` event. The caller checks the bid against the hosts' minimums."""
        async with self._lock:
            rec = self._open.get(workload_id)
            if rec is None:
                raise NotFound(f"no open workload {workload_id!r}")
            terms = rec.spec.rental
            if terms is None or terms.kind != "interruptible":
                kind = terms.kind if terms is not None else "on_demand"
                raise InvalidTransition(f"workload {workload_id} is rented {kind}; only an interruptible workload has a bid")
            spec = msgspec.structs.replace(rec.spec, rental=msgspec.structs.replace(terms, bid=bid))
            updated = msgspec.structs.replace(rec, spec=spec, version=rec.version + 1)
            await workload_repo(self._store).update(updated, expected_version=rec.version)
            self._unindex(rec)
            self._index(updated)
            await self._master.record_event(BID_EVENT, workload_id, account=rec.account, old=terms.bid, new=bid, at=now)
        self._notify("bid", updated)
        return updated

    async def end(
        self, workload_id: str, event: str, reason: str, now: float, *, grace_s: float, **changes: Unpack[WorkloadChanges]
    ) -> WorkloadRecord:
        """Delete the workload's containers (SIGTERM, ``grace_s``, then SIGKILL) and apply ``event``: how the loop
        preempts, requeues, fails or finishes one. A workload sent back to the queue forgets its assignments (the
        deletes under way free their GPUs); one that keeps them (preempted) shows them as ``deleting``."""
        async with self._lock:
            rec = await self._end(await self.get(workload_id), event, reason, now, grace_s=grace_s, changes=changes)
        self._notify("transition", rec)
        return rec

    # --- inside ------------------------------------------------------------------------------------------

    async def _transition(
        self, workload_id: str, event: str, reason: str, now: float, changes: WorkloadChanges
    ) -> WorkloadRecord:
        rec = self._open.get(workload_id)
        if rec is None:
            stored = await workload_repo(self._store).get(workload_id)
            if stored is None:
                raise NotFound(f"no workload {workload_id!r}")
            raise InvalidTransition(f"workload {workload_id} is {stored.state}, which is final; it takes no {event!r}")
        fixed = sorted(_FIXED_FIELDS & changes.keys())
        if fixed:
            raise ValueError(f"a transition may not set {', '.join(fixed)}")
        target = WORKLOAD.next(rec.state, event)
        updated = msgspec.structs.replace(
            rec, **(_implied(rec, event, target, now) | changes), state=target, state_reason=reason, version=rec.version + 1
        )
        await workload_repo(self._store).update(updated, expected_version=rec.version)
        self._unindex(rec)
        if target not in FINAL_WORKLOAD_STATES:
            self._index(updated)
        await self._record(updated, rec.state, event, reason)
        return updated

    async def _delete_containers(
        self, workload_id: str, assignments: Iterable[Assignment], *, grace_s: float | None, timeout_s: float | None = None
    ) -> builtins.list[str]:
        """Send a delete for each of ``assignments``; returns what could not be sent (the host refused: e.g. it was
        retired), each as a sentence, and records each refusal as an event."""
        refused: builtins.list[str] = []
        for a in assignments:
            spec = DeleteSpec(name=a.container, timeout_s=self._delete_grace_s if grace_s is None else grace_s)
            try:
                await self._master.create_command(a.agent_id, spec, timeout_s=timeout_s)
            except IdlegridError as exc:
                refused.append(f"{a.container} on {a.agent_id}: {exc}")
                await self._master.record_event(
                    DELETE_REFUSED_EVENT, workload_id, agent_id=a.agent_id, container=a.container, error=str(exc)
                )
        return refused

    async def _record(self, rec: WorkloadRecord, old: str, event: str, reason: str) -> None:
        data = {"from": old, "to": rec.state, "event": event, "reason": reason, "account": rec.account}
        await self._master.record_event(TRANSITION_EVENT, rec.id, **data)

    def _index(self, rec: WorkloadRecord) -> None:
        self._open[rec.id] = rec
        self._by_state[rec.state].add(rec.id)
        self._by_account[rec.account].add(rec.id)

    def _unindex(self, rec: WorkloadRecord) -> None:
        self._open.pop(rec.id, None)
        self._by_state[rec.state].discard(rec.id)
        self._by_account[rec.account].discard(rec.id)

    def _notify(self, what: str, rec: WorkloadRecord) -> None:
        if what != "transition" or rec.state == WorkloadState.QUEUED:
            self.wakeup.set()
        for listener in self._listeners:
            try:
                listener(what, rec)
            except Exception:
                log.exception("a workload listener failed", extra={"workload": rec.id})


def pending_output(rec: WorkloadRecord, a: Assignment, now: float) -> KeptOutput:
    """The record that awaits ``a``'s output, from the moment its container is asked to go."""
    return KeptOutput(
        id=output_key(rec.id, a.replica, rec.attempts),
        workload_id=rec.id,
        account=rec.account,
        replica=a.replica,
        attempt=rec.attempts,
        agent_id=a.agent_id,
        container=a.container,
        ended_at=now,
    )


def _implied(rec: WorkloadRecord, event: str, target: str, now: float) -> WorkloadChanges:
    """What an event changes besides the state: timestamps and counters."""
    if event == "schedule":  # placed again: a run that ended through a host is behind it, and so is its start
        return {"scheduled_at": now, "started_at": None, "attempts": rec.attempts + 1, "host_failure": ""}
    if event == "run":  # running: an image pull's progress (the detail while it started) is over
        return {"started_at": now, "detail": ""}
    if event == "preempt":
        return {"preemptions": rec.preemptions + 1}
    if event == "requeue":  # back in line at its original place (queued_at is kept), placed anew; ``started_at`` stays,
        # when its latest run started (shown while it waits again, its host perhaps gone), until it is placed again
        return {"assignments": [], "scheduled_at": None, "preempted_for": "", "detail": ""}
    if target in FINAL_WORKLOAD_STATES:
        return {"finished_at": now, "preempted_for": "", "detail": ""}
    return {}
