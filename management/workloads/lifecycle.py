"""The workload lifecycle as a pure step: a placed workload's record and the facts about its replicas in, actions out.

``step(record, facts, policy, now) -> actions`` decides everything that happens to a workload between its placement
and its end: when it is starting and running, when it succeeded or failed (by its containers' exit codes), when it
restarts (its restart policy, up to ``max_restarts``), when it ran too long (``max_duration_s``), when a host lost it,
when a preempted one goes back to the queue. ``strays`` decides which workload containers nobody holds are deleted
again. No I/O, no clock: the runner (runner.py) gathers the facts from the Master, calls the step and carries out
what it returns, in order, and nothing else; the scheduler core (management/scheduler/core.py) decides placement.
The model is master/session.py's ``AgentSession.receive -> Verdict``.

The actions are a closed set, each carried out by the runner in one way:

- ``Adopt(replica)``: the replica's container already runs on its host (created before a Master restart): its
  assignment is marked running, no create is sent;
- ``TakeOver(replica, command_id)``: a create already holds the replica's GPUs (made by a Master that died before it
  noted the id): the assignment notes that command and waits for it;
- ``Create(replica, timeout_s)``: send the replica's create (a refusal ends the run: ``create_refused``);
- ``Advance(event, reason, changes)``: a transition that touches no container (``WorkloadBook.transition``);
- ``End(event, reason, grace_s, changes)``: a transition that ends the run: the live containers are deleted with
  ``grace_s`` between SIGTERM and SIGKILL, their output awaited (``WorkloadBook.end``);
- ``Note(detail)``: the workload's ``detail`` changes (an image pull's progress), nothing else.

Invariants (tests/management/workloads/test_lifecycle.py states each as a hypothesis property):

1. Every ``Advance`` and ``End`` event is one the transition table (states.py ``WORKLOAD``) takes from the state the
   workload is in by then: applying the actions in order never raises ``InvalidTransition``.
2. An ``End`` is the last action, and a step that ends the run sends no create: no workload is both running (or
   starting a container) and finished; a final or queued workload gets no action.
3. A restart (an ``End`` that requeues with ``restarts``) happens only under restart policy ``on_failure`` or
   ``always``, counts one more restart than the record has, and never more than ``max_restarts``.
4. A running workload past its ``max_duration_s`` always leaves ``running`` in that step, whatever its facts.
5. Creates are asked only for assignments that have none (state ``pending``, no command id), at most one per replica,
   and none once any replica's create failed.
6. A container that exits non-zero is the workload's own failure (no ``host_failure``); a replica lost through its
   host (gone, retired or quarantined, its container vanished from a host that answers, its create failed there)
   names that host in ``host_failure``; a create refused for the renter's request fails at once, blaming no host.
7. A create that failed through its host sends the workload to another host (``start_failed_on`` grows, the scheduler
   avoids those hosts) at most ``start_retries`` times, and never away from the host a rental pins.

The restart policy read is ``WorkloadSpec.restart_policy_in_force``: the spec's, else ``on_failure`` for work with a
checkpoint or a bid (what a renter means: it resumes), else ``never``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from common.errors import is_renter_fault
from management.workloads.spec import workload_of
from management.workloads.states import GONE_ASSIGNMENT_STATES, AssignmentState, WorkloadChanges, WorkloadState
from master.port import Assignment, CommandState, WorkloadRecord

W = WorkloadState
A = AssignmentState

RESTARTING_POLICIES = frozenset({"on_failure", "always"})
FAILED_COMMAND_STATES = frozenset({CommandState.FAILED.value, CommandState.TIMED_OUT.value, CommandState.CANCELLED.value})
_SUCCEEDED = CommandState.SUCCEEDED.value
_STARTED_COMMAND_STATES = frozenset({CommandState.ACKED.value, _SUCCEEDED})
_PENDING = CommandState.PENDING.value
STRAY_RETRY_S = 30.0  # a stray container whose delete was asked for is asked again after this long


class HostStatus(enum.StrEnum):
    """What the Master knows of a replica's host."""

    ANSWERING = "answering"  # on the grid and not offline: its list of containers is current
    OFFLINE = "offline"  # heartbeats missed: what it runs is unknown, so nothing is concluded from its silence
    RETIRED = "retired"  # retired or quarantined: what ran there is lost
    LEFT = "left"  # no longer on the grid at all


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """What the Master knows now about one replica's container; the runner reads it (``Runner.facts``)."""

    host: HostStatus = HostStatus.ANSWERING
    listed: bool = False  # its host lists the container
    exit_code: int | None = None  # its host reported the container exited with this code
    create_state: str = ""  # the state of the create command the assignment names ("" when none is known)
    create_error_code: str = ""  # the failed create's error code (common.errors), "" otherwise
    create_error: str = ""  # ... and its words
    pulling: str = ""  # how its image pull goes, as its agent last said ("" when none is under way)
    has_image: bool = True  # its host lists the workload's image (else the create gets the pull allowance)
    create_made: str = ""  # a create command that holds its GPUs for this container, unnamed by the record


@dataclass(frozen=True, slots=True)
class Facts:
    replicas: tuple[ReplicaFacts, ...]  # one per assignment, in the record's order


@dataclass(frozen=True, slots=True)
class LifecyclePolicy:
    grace_s: float = 30.0  # a container stopped before its end gets this long between SIGTERM and SIGKILL
    start_timeout_s: float = 300.0  # a create that has not finished by then failed
    pull_allowance_s: float = 1800.0  # ... plus this on a host that does not list the image
    start_retries: int = 2  # a container that did not start through its host is tried on at most this many others


@dataclass(frozen=True, slots=True)
class Adopt:
    replica: int


@dataclass(frozen=True, slots=True)
class TakeOver:
    replica: int
    command_id: str


@dataclass(frozen=True, slots=True)
class Create:
    replica: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Advance:
    event: str
    reason: str
    changes: WorkloadChanges = field(default_factory=WorkloadChanges)


@dataclass(frozen=True, slots=True)
class End:
    event: str
    reason: str
    grace_s: float
    changes: WorkloadChanges = field(default_factory=WorkloadChanges)


@dataclass(frozen=True, slots=True)
class Note:
    detail: str


Action = Adopt | TakeOver | Create | Advance | End | Note


@dataclass(frozen=True, slots=True)
class DeleteStray:
    agent_id: str
    container: str


@dataclass(frozen=True, slots=True)
class HostContainers:
    """One host's containers, for the stray sweep."""

    agent_id: str
    answering: bool  # see HostStatus.ANSWERING: a host that is not is left alone
    containers: Collection[str]


def step(rec: WorkloadRecord, facts: Facts, policy: LifecyclePolicy, now: float) -> tuple[Action, ...]:
    """The actions that bring ``rec`` in line with ``facts`` (see the module's docstring). ValueError when the facts
    do not name one replica per assignment."""
    if len(facts.replicas) != len(rec.assignments):
        raise ValueError(f"{len(facts.replicas)} replica facts for {len(rec.assignments)} assignments of {rec.id}")
    if rec.state in (W.SCHEDULED, W.STARTING):
        return _starting(rec, facts, policy)
    if rec.state == W.RUNNING:
        return _running(rec, facts, policy, now)
    if rec.state == W.PREEMPTED:
        return _preempted(rec, facts)
    return ()


def create_refused(rec: WorkloadRecord, agent_id: str, error: str, policy: LifecyclePolicy) -> End:
    """What follows when the Master refuses a ``Create`` (its host went away since the placement): back to the queue."""
    return End("requeue", f"host {agent_id} refused the container: {error}", policy.grace_s)


def _starting(rec: WorkloadRecord, facts: Facts, policy: LifecyclePolicy) -> tuple[Action, ...]:
    creates: list[Action] = []
    states: list[str] = []  # each replica's create, as far as this step knows
    failed_on: list[str] = []  # the hosts whose create failed, in replica order
    pulls: list[str] = []  # how the image pulls under way go, per replica still starting
    for a, f in zip(rec.assignments, facts.replicas, strict=True):
        if not a.command_id and a.state == A.PENDING:
            creates.append(_create(a, f, policy, fetches=bool(rec.spec.inputs or rec.spec.checkpoint)))
            states.append(_SUCCEEDED if f.listed else _PENDING)
            continue
        state = _SUCCEEDED if a.state == A.RUNNING else (f.create_state or _PENDING)
        states.append(state)
        if state in FAILED_COMMAND_STATES:
            failed_on.append(a.agent_id)
            if is_renter_fault(f.create_error_code):
                return (_refused(rec, f),)
        elif state != _SUCCEEDED and f.pulling:
            pulls.append(f.pulling if len(rec.assignments) == 1 else f"replica {a.replica}: {f.pulling}")
    failed = [s for s in states if s in FAILED_COMMAND_STATES]
    if failed:
        return _start_failed(rec, facts, failed_on, f"{len(failed)} of {len(states)} container(s)", policy)
    actions = list(creates)
    if all(s == _SUCCEEDED for s in states):
        if rec.state == W.SCHEDULED:
            actions.append(Advance("start", "containers created"))
        assignments = [msgspec.structs.replace(a, state=str(A.RUNNING)) for a in rec.assignments]
        actions.append(Advance("run", f"{len(assignments)} container(s) running", {"assignments": assignments}))
        return tuple(actions)
    if rec.state == W.SCHEDULED and any(s in _STARTED_COMMAND_STATES for s in states):
        actions.append(Advance("start", "hosts acknowledged"))
        return tuple(actions)
    detail = "; ".join(pulls)
    if detail != rec.detail:
        actions.append(Note(detail))
    return tuple(actions)


def _create(a: Assignment, f: ReplicaFacts, policy: LifecyclePolicy, *, fetches: bool = False) -> Action:
    if f.listed:  # created before a restart: adopt it
        return Adopt(a.replica)
    if f.create_made:  # a create is on its way already: another would take its GPUs and clash on the name
        return TakeOver(a.replica, f.create_made)
    # A host that pulls an image, or fetches inputs and a checkpoint before the command starts (docs/storage.md), gets
    # the pull allowance more: a slow renter's registry or store must not time the create out as the host's fault.
    timeout_s = policy.start_timeout_s + (0.0 if f.has_image and not fetches else policy.pull_allowance_s)
    return Create(a.replica, timeout_s)


def _start_failed(
    rec: WorkloadRecord, facts: Facts, failed_on: list[str], count: str, policy: LifecyclePolicy
) -> tuple[Action, ...]:
    """Containers did not start through their hosts (the renter's request was not the cause): the workload goes back to
    the queue to be placed elsewhere (``start_failed_on``, which the scheduler avoids), blaming the host, while fewer
    than ``policy.start_retries`` hosts failed it before and it is not pinned to that host; then its restart policy
    decides. The renter reads the host's words (its agent takes secrets and its own paths out of them)."""
    first = failed_on[0]
    pairs = zip(rec.assignments, facts.replicas, strict=True)
    f = next((f for a, f in pairs if a.agent_id == first and f.create_state), ReplicaFacts())
    state = f.create_state or CommandState.FAILED.value
    reason = f"{count} did not start on {first} ({state}): {f.create_error or 'no reason given'}"
    blame = f"{first}: container did not start ({state})"
    pin = rec.spec.rental.offer if rec.spec.rental is not None else None
    # The host a rental pins is never avoided: the workload may run nowhere else.
    tried = [h for h in dict.fromkeys([*rec.start_failed_on, *failed_on]) if h != pin]
    if len(tried) <= policy.start_retries and pin not in failed_on:
        why = f"{reason}; trying another host ({len(tried)} of {policy.start_retries} hosts may fail it)"
        return (End("requeue", why, policy.grace_s, {"host_failure": blame, "start_failed_on": tried}),)
    return _failed(rec, reason, policy, host_failure=blame, start_failed_on=tried)


def _refused(rec: WorkloadRecord, f: ReplicaFacts) -> End:
    """A container did not start because of the renter's request (no such image, credentials refused, too large, a
    bad command: common.errors.RENTER_FAULT_CODES): the workload fails with the host's words, at once (a restart would
    fail the same way), and no host is blamed (no ``host_failure``, no reputation loss)."""
    reason = f"did not start ({f.create_error_code}): {f.create_error or 'no reason given'}"
    return End("fail" if rec.state == W.RUNNING else "start_failed", reason, 0.0)


def _running(rec: WorkloadRecord, facts: Facts, policy: LifecyclePolicy, now: float) -> tuple[Action, ...]:
    codes: list[int] = []
    lost: list[str] = []
    through: list[str] = []  # "<agent id>: why", per lost replica
    for a, f in zip(rec.assignments, facts.replicas, strict=True):
        if f.host in (HostStatus.LEFT, HostStatus.RETIRED):
            lost.append(f"host {a.agent_id} is gone")
            why = "retired or quarantined" if f.host == HostStatus.RETIRED else "left the grid"
            through.append(f"{a.agent_id}: host is gone ({why})")
        elif f.exit_code is not None:
            codes.append(f.exit_code)
        elif not f.listed and f.host != HostStatus.OFFLINE:
            lost.append(f"container {a.container} vanished from {a.agent_id}")
            through.append(f"{a.agent_id}: container {a.container} vanished")
    if lost:
        return (End("requeue", "; ".join(lost), policy.grace_s, {"host_failure": through[0]}),)
    bad = next((code for code in codes if code != 0), None)
    if bad is not None:
        return _failed(rec, f"a container exited with code {bad}", policy, exit_codes=codes)
    if len(codes) == len(rec.assignments):
        if rec.spec.restart_policy_in_force == "always" and rec.restarts < rec.spec.max_restarts:
            reason = "all containers exited 0; restart_policy always"
            return (End("requeue", reason, policy.grace_s, {"restarts": rec.restarts + 1}),)
        return (End("succeed", "all containers exited 0", 0.0, {"exit_codes": codes}),)
    started = rec.started_at or rec.scheduled_at or rec.queued_at
    if rec.spec.max_duration_s is not None and now - started > rec.spec.max_duration_s:
        return (End("fail", f"ran past its max_duration_s ({rec.spec.max_duration_s:g} s)", policy.grace_s),)
    return ()


def _preempted(rec: WorkloadRecord, facts: Facts) -> tuple[Action, ...]:
    if any(f.host == HostStatus.ANSWERING and f.listed for f in facts.replicas):
        return ()  # still stopping
    for_job = rec.preempted_for or "a higher priority workload"
    if rec.spec.restart_policy_in_force in RESTARTING_POLICIES:
        return (Advance("requeue", f"preempted for {for_job}; back in the queue"),)
    return (Advance("fail", f"preempted for {for_job}; restart_policy never"),)


def _failed(
    rec: WorkloadRecord,
    reason: str,
    policy: LifecyclePolicy,
    *,
    exit_codes: list[int] | None = None,
    host_failure: str = "",
    start_failed_on: list[str] | None = None,
) -> tuple[Action, ...]:
    """A replica failed: restart (back to the queue) while the restart policy allows, otherwise fail.
    ``host_failure`` ("<agent id>: why"): it failed through that host (a container that did not start there)."""
    blame = WorkloadChanges(host_failure=host_failure) if host_failure else WorkloadChanges()
    if start_failed_on is not None:
        blame["start_failed_on"] = start_failed_on
    if rec.spec.restart_policy_in_force in RESTARTING_POLICIES and rec.restarts < rec.spec.max_restarts:
        restarts = rec.restarts + 1
        why = f"{reason}; restart {restarts} of {rec.spec.max_restarts}"
        return (End("requeue", why, policy.grace_s, {"restarts": restarts} | blame),)
    codes = WorkloadChanges() if exit_codes is None else WorkloadChanges(exit_codes=exit_codes)
    return (End("fail" if rec.state == W.RUNNING else "start_failed", reason, 0.0, codes | blame),)


def strays(
    records: Iterable[WorkloadRecord],
    hosts: Iterable[HostContainers],
    deleting: Collection[tuple[str, str]],
    tried: Mapping[tuple[str, str], float],
    now: float,
    retry_s: float = STRAY_RETRY_S,
) -> tuple[list[DeleteStray], dict[tuple[str, str], float]]:
    """Which workload containers to delete again: those a host that answers runs that no open workload holds (as
    anything but deleting or deleted) and no delete under way (``deleting``: (host, container)) is for. Its create ran
    after its delete (a host runs commands concurrently, so a delete can find nothing yet), or a killed Master stored
    a stop it did not send; it would otherwise hold its GPUs, and keep a preempted workload stopping, for ever.
    ``tried``: (host, container) -> when its delete was last asked for; one is asked again after ``retry_s``.
    Returns the deletes and the new ``tried`` (strays no longer seen are forgotten)."""
    held = {(a.agent_id, a.container) for rec in records for a in rec.assignments if a.state not in GONE_ASSIGNMENT_STATES}
    deletes: list[DeleteStray] = []
    seen: dict[tuple[str, str], float] = {}
    for host in hosts:
        if not host.answering:
            continue
        for name in host.containers:
            key = (host.agent_id, name)
            if workload_of(name) is None or key in held or key in deleting:
                continue
            last = tried.get(key)
            if last is not None and now - last < retry_s:
                seen[key] = last
                continue
            seen[key] = now
            deletes.append(DeleteStray(host.agent_id, name))
    return deletes, seen
