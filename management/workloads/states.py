"""The workload's and its replicas' states, as enums, and the workload's transition table.

Pure: no I/O. ``WorkloadBook`` (book.py) applies these transitions to stored records and records each one; the
lifecycle step (lifecycle.py) decides which event happens. The members are ``StrEnum``s whose values are the strings
stored in records and sent on the wire: a record's ``state`` is still a plain string, and compares equal to its
member (``rec.state == WorkloadState.RUNNING``), so code compares with the member, never with ``.value``.

States::

    queued -> scheduled -> starting -> running -> succeeded | failed | cancelled
    preempted -> queued

plus: running/starting/scheduled -> queued ("requeue": its GPU turned faulty or its host went offline),
scheduled/starting/running -> preempted ("preempt"), preempted -> failed (restart policy "never"),
scheduled/starting -> failed ("start_failed": no restarts left),
queued -> failed ("reject": it can never fit), and "cancel" from every state that is not final.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from master.port import StateMachine


class WorkloadState(enum.StrEnum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"  # placed: hosts and GPUs chosen, create commands issued
    STARTING = "starting"  # the agents acknowledged; containers are being created
    RUNNING = "running"
    PREEMPTED = "preempted"  # stopped for a higher priority; goes back to the queue
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AssignmentState(enum.StrEnum):
    """One replica's container, as the workload's ``Assignment.state`` records it."""

    PENDING = "pending"  # placed; its create is not known to have succeeded
    RUNNING = "running"  # its create succeeded (or its container was found on its host and adopted)
    EXITED = "exited"
    DELETING = "deleting"  # its delete was asked for; its output is awaited (management/services/outputs.py)
    DELETED = "deleted"  # deleted, its output kept or given up


W = WorkloadState
A = AssignmentState
GONE_ASSIGNMENT_STATES = frozenset({str(A.DELETING), str(A.DELETED)})  # a container asked to go, or gone


def _table(rows: list[tuple[list[WorkloadState], str, WorkloadState]]) -> dict[tuple[str, str], str]:
    return {(str(source), event): str(target) for sources, event, target in rows for source in sources}


FINAL_WORKLOAD_STATES = frozenset({str(W.SUCCEEDED), str(W.FAILED), str(W.CANCELLED)})
OPEN_WORKLOAD_STATES = frozenset(str(s) for s in W) - FINAL_WORKLOAD_STATES
WORKLOAD_STATES = tuple(str(s) for s in W)

WORKLOAD = StateMachine(
    "workload",
    _table(
        [
            ([W.QUEUED], "schedule", W.SCHEDULED),
            ([W.SCHEDULED], "start", W.STARTING),
            ([W.STARTING], "run", W.RUNNING),
            ([W.RUNNING], "succeed", W.SUCCEEDED),
            ([W.RUNNING], "fail", W.FAILED),
            ([W.SCHEDULED, W.STARTING], "start_failed", W.FAILED),
            ([W.QUEUED], "reject", W.FAILED),
            ([W.SCHEDULED, W.STARTING, W.RUNNING], "preempt", W.PREEMPTED),
            ([W.PREEMPTED], "fail", W.FAILED),  # stopped for a higher priority, and its restart policy is "never"
            ([W.PREEMPTED], "requeue", W.QUEUED),
            ([W.SCHEDULED, W.STARTING, W.RUNNING], "requeue", W.QUEUED),
            ([W.QUEUED, W.SCHEDULED, W.STARTING, W.RUNNING, W.PREEMPTED], "cancel", W.CANCELLED),
        ]
    ),
)


def allowed_events(state: str) -> Mapping[str, str]:
    """The events ``state`` takes, each with the state it leads to (for an error message or a UI)."""
    return {event: target for (source, event), target in WORKLOAD.table.items() if source == state}
