"""An endpoint's autoscaler as a pure function: its policy, its queue, its workers and ``now`` in; workers to start and
workers to stop, each with its reason, out.

``decide(policy, queue, workers, now, may_scale_up=...) -> Decision``. No I/O, no clock: the shell (to come, a
``Loop`` on the Master) gathers the facts, calls it and carries out the decision: it asks the scheduler for
``start`` more worker workloads and ends the ``stop`` ones (a stopped worker's requests go back to the queue, by the
queue's own rules). The rules, Knative's and RunPod Serverless's together:

- **Demand** is every request the endpoint holds: the waiting ones and the ones in flight on a worker. A stuck
  worker's requests count as waiting: they go back to the queue as it is stopped. ``needed = ceil(demand /
  concurrency)`` workers hold it all at once (Knative's rule: observed concurrency over the per-pod target).
- **Capacity** is every healthy worker, the ``starting`` ones included: a worker asked for is counted from the tick
  that asked, so a queue that waits on cold starts does not start a second round (no overshoot).
- **Scale up** (only while ``may_scale_up``: a spend cap or a paused endpoint says no) to ``min_workers`` at any time,
  and to ``needed`` when requests wait and either no worker is ready yet (a burst from zero: nothing is taking them,
  and the requests of a burst that arrive while its first workers start are counted with the first ones) or the
  oldest waiting request has waited longer than ``target_queue_delay_s`` (RunPod's "queue delay" scaler: the workers
  there do not keep up). Never past ``max_workers``. While a worker is ready and the oldest wait is within the target,
  the workers there are keeping up, and none is added.
- **Scale down**: a ready worker with nothing in flight, idle for ``idle_timeout_s`` or more, is stopped while no
  request waits and the workers left still hold ``max(min_workers, needed)``; the longest idle goes first. Starting
  workers are left to become ready (their cold start is paid for), unless the policy's ``max_workers`` was lowered
  under the count: then idle workers go first, starting ones next, busy ones never.
- **Stuck workers are replaced**: ``unhealthy`` ones (the shell saw the container exit or fail its readiness), ones
  ``starting`` for longer than ``start_timeout_s`` and ready ones silent (no heartbeat or call) for longer than
  ``heartbeat_timeout_s`` are stopped whatever they hold, and no longer count as capacity, so the same tick starts
  their replacements by the rules above.

Invariants (tests/management/endpoints/test_autoscaler.py states each as a hypothesis property, by these names):

1. ``never_above_max``: the healthy workers after the decision are at most ``max_workers``, except busy ones that a
   lowered ``max_workers`` finds: those finish (and are stopped once idle); starts never take the count past it.
2. ``never_below_min``: while ``may_scale_up``, the healthy workers after the decision are at least ``min_workers``
   (a policy with ``min_workers > max_workers`` is refused when it is made).
3. ``never_stops_work_in_flight``: a worker stopped with requests in flight is always a stuck one.
4. ``scales_to_zero_only_after_idle_timeout``: a healthy worker is stopped for idleness only when ready, with nothing
   in flight, idle ``idle_timeout_s`` or more, and no request waits (nor comes back from a stuck worker).
5. ``burst_from_zero_starts_enough``: with no ready worker and requests waiting, the healthy workers after the
   decision are at least ``min(max_workers, max(min_workers, needed))`` (starting ones counted): every request has a
   slot the moment they are ready.
6. ``scales_up_on_queue_delay``: a request waiting past the target with fewer than ``needed`` healthy workers (and
   fewer than ``max_workers``) starts at least one worker.
7. ``starting_workers_count_no_overshoot``: the healthy workers after a decision that starts some are at most
   ``min(max_workers, max(min_workers, needed))`` (starting ones counted); and the next tick, with those workers
   starting, starts none.
8. ``stuck_workers_replaced``: every stuck worker is stopped, and never counts toward capacity.
9. ``no_start_when_scale_up_refused``: ``may_scale_up=False`` starts nothing.
10. ``holds_within_target``: while a ready worker exists, healthy ones at or above ``min_workers``, and the oldest
    wait is within the target, nothing starts.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec


class ScalingPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint's scaling policy (the renter's, validated when it is made)."""

    min_workers: int = 0  # kept warm whatever the load; 0: scale to zero
    max_workers: int = 1
    idle_timeout_s: float = 60.0  # how long an idle worker is kept (above min_workers)
    target_queue_delay_s: float = 4.0  # RunPod's default queue delay
    concurrency: int = 1  # requests one worker holds at once
    start_timeout_s: float = 600.0  # a worker starting longer than this is stuck (an image pull included)
    heartbeat_timeout_s: float = 30.0  # a ready worker silent longer than this is stuck

    def __post_init__(self) -> None:
        if self.min_workers < 0 or self.max_workers < 0:
            raise ValueError("min_workers and max_workers must be 0 or more")
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        if self.concurrency < 1:
            raise ValueError("concurrency must be 1 or more requests per worker")
        if self.idle_timeout_s < 0 or self.target_queue_delay_s < 0:
            raise ValueError("idle_timeout_s and target_queue_delay_s must be 0 or more seconds")
        if self.start_timeout_s <= 0 or self.heartbeat_timeout_s <= 0:
            raise ValueError("start_timeout_s and heartbeat_timeout_s must be more than 0 seconds")


class QueueView(msgspec.Struct, frozen=True, kw_only=True):
    """The endpoint's waiting requests. Requests in flight are counted on their workers (``Worker.in_flight``): one
    owner per fact, so the two can never disagree."""

    waiting: int = 0
    oldest_waiting_since: float | None = None  # when the oldest waiting request was queued (None: none waits)


class WorkerPhase(str, enum.Enum):
    STARTING = "starting"  # asked for: placed, pulling or starting, not yet taking requests
    READY = "ready"  # taking requests: idle, or busy with ``in_flight`` of them
    UNHEALTHY = "unhealthy"  # the shell saw it fail: its container exited, its host was lost, readiness failed


class Worker(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    phase: WorkerPhase
    since: float  # when it entered this phase
    in_flight: int = 0  # requests it took and has not answered
    last_seen: float | None = None  # its last heartbeat or call (None: none since ``since``)
    idle_since: float | None = None  # ready with nothing in flight: since when (None: since ``since``)


class StopReason(str, enum.Enum):
    IDLE = "idle"  # idle for idle_timeout_s, not needed
    ABOVE_MAX = "above_max"  # max_workers was lowered under the count
    UNHEALTHY = "unhealthy"
    START_TIMEOUT = "start_timeout"
    SILENT = "silent"  # no heartbeat for heartbeat_timeout_s


STUCK_REASONS = frozenset({StopReason.UNHEALTHY, StopReason.START_TIMEOUT, StopReason.SILENT})


@dataclass(frozen=True, slots=True)
class Stop:
    worker: str
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Decision:
    start: int  # new workers to ask for
    stop: tuple[Stop, ...]  # in the order to stop them
    desired: int  # the healthy workers this decision leaves (busy ones a lowered max_workers finds included)
    why: str  # one line a renter can read: why this many


def stuck_reason(worker: Worker, policy: ScalingPolicy, now: float) -> StopReason | None:
    """Why ``worker`` is stuck at ``now``, or None if it is healthy."""
    if worker.phase is WorkerPhase.UNHEALTHY:
        return StopReason.UNHEALTHY
    if worker.phase is WorkerPhase.STARTING:
        return StopReason.START_TIMEOUT if now - worker.since > policy.start_timeout_s else None
    seen = worker.since if worker.last_seen is None else max(worker.since, worker.last_seen)
    return StopReason.SILENT if now - seen > policy.heartbeat_timeout_s else None


def idle_for(worker: Worker, now: float) -> float | None:
    """How long a ready worker has had nothing in flight; None for a busy or not ready one."""
    if worker.phase is not WorkerPhase.READY or worker.in_flight > 0:
        return None
    return now - (worker.since if worker.idle_since is None else max(worker.since, worker.idle_since))


def needed_workers(policy: ScalingPolicy, queue: QueueView, workers: Sequence[Worker]) -> int:
    """Workers that hold every request the endpoint has at once (waiting and in flight), uncapped."""
    demand = queue.waiting + sum(worker.in_flight for worker in workers)
    return math.ceil(demand / policy.concurrency)


def queue_delay(queue: QueueView, now: float) -> float:
    """How long the oldest waiting request has waited (0 when none waits)."""
    if queue.waiting <= 0 or queue.oldest_waiting_since is None:
        return 0.0
    return max(0.0, now - queue.oldest_waiting_since)


def decide(
    policy: ScalingPolicy, queue: QueueView, workers: Sequence[Worker], now: float, *, may_scale_up: bool = True
) -> Decision:
    """The workers to start and to stop at ``now`` (see the module docstring for the rules)."""
    stops = [Stop(w.id, reason) for w in sorted(workers, key=lambda w: w.id) if (reason := stuck_reason(w, policy, now))]
    stuck = {stop.worker for stop in stops}
    healthy = [w for w in workers if w.id not in stuck]
    needed = needed_workers(policy, queue, workers)
    delay = queue_delay(queue, now)
    count = len(healthy)
    # A stuck worker's requests go back to the queue as it is stopped: they wait from this tick on.
    waiting = queue.waiting + sum(w.in_flight for w in workers if w.id in stuck)

    goal, why = policy.min_workers, f"{count} healthy for {needed} needed, min_workers {policy.min_workers}"
    if waiting > 0 and needed > goal:
        if not any(w.phase is WorkerPhase.READY for w in healthy):
            goal, why = needed, f"{waiting} waiting and no worker ready: {needed} hold them"
        elif delay > policy.target_queue_delay_s:
            goal, why = needed, f"oldest request waited {delay:.1f} s > target {policy.target_queue_delay_s:g} s"
        else:
            why = f"queue delay {delay:.1f} s within target {policy.target_queue_delay_s:g} s"
    if goal > policy.max_workers:
        goal, why = policy.max_workers, f"{why}; capped at max_workers {policy.max_workers}"

    start = 0
    if count < goal:
        if may_scale_up:
            start = goal - count
        else:
            why = f"{why}; scale-up refused (spend cap or paused)"
    elif count > policy.max_workers:
        stops += _above_max(healthy, count - policy.max_workers, now)
        why = f"above max_workers {policy.max_workers}"
    elif waiting == 0:
        idle = _idle_stops(policy, healthy, keep=max(policy.min_workers, min(needed, policy.max_workers)), now=now)
        if idle:
            stops += idle
            why = f"{len(idle)} idle for {policy.idle_timeout_s:g} s or more"
    stopped_healthy = len(stops) - len(stuck)
    return Decision(start=start, stop=tuple(stops), desired=count - stopped_healthy + start, why=why)


def _idle_stops(policy: ScalingPolicy, healthy: Sequence[Worker], *, keep: int, now: float) -> list[Stop]:
    idle = [(spell, w.id) for w in healthy if (spell := idle_for(w, now)) is not None and spell >= policy.idle_timeout_s]
    idle.sort(key=lambda pair: (-pair[0], pair[1]))  # the longest idle first, then by id: the same facts, one answer
    room = max(0, len(healthy) - keep)
    return [Stop(worker, StopReason.IDLE) for _, worker in idle[:room]]


def _above_max(healthy: Sequence[Worker], excess: int, now: float) -> list[Stop]:
    """Up to ``excess`` workers a lowered max_workers no longer allows: idle ones (longest idle first), then starting
    ones (the latest asked first: the least cold start lost), never busy ones."""
    idle = sorted((w for w in healthy if idle_for(w, now) is not None), key=lambda w: (-(idle_for(w, now) or 0.0), w.id))
    starting = sorted((w for w in healthy if w.phase is WorkerPhase.STARTING), key=lambda w: (-w.since, w.id))
    return [Stop(w.id, StopReason.ABOVE_MAX) for w in [*idle, *starting][:excess]]
