"""The workload's and its replicas' states, as enums (their home is ``state_names.py``), and the workload's transition
table.

Pure: no I/O. ``WorkloadBook`` (book.py) applies these transitions to stored records and records each one; the
lifecycle step (lifecycle.py) decides which event happens.

States::

    queued -> scheduled -> starting -> running -> succeeded | failed | cancelled
    preempted -> queued

plus: running/starting/scheduled -> queued ("requeue": its GPU turned faulty or its host went offline),
scheduled/starting/running -> preempted ("preempt"), preempted -> failed (restart policy "never"),
scheduled/starting -> failed ("start_failed": no restarts left),
queued -> failed ("reject": it can never fit), and "cancel" from every state that is not final.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from management.workloads.state_names import (
    FINAL_WORKLOAD_STATES,
    GONE_ASSIGNMENT_STATES,
    HOLDING_STATES,
    OPEN_WORKLOAD_STATES,
    WORKLOAD_STATES,
    AssignmentState,
    W,
    WorkloadState,
)
from master.port import Assignment, StateMachine

__all__ = [
    "FINAL_WORKLOAD_STATES",
    "GONE_ASSIGNMENT_STATES",
    "HOLDING_STATES",
    "OPEN_WORKLOAD_STATES",
    "WORKLOAD",
    "WORKLOAD_STATES",
    "AssignmentState",
    "WorkloadChanges",
    "WorkloadState",
    "allowed_events",
]


def _table(rows: list[tuple[list[WorkloadState], str, WorkloadState]]) -> dict[tuple[str, str], str]:
    return {(str(source), event): str(target) for sources, event, target in rows for source in sources}


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


class WorkloadChanges(TypedDict, total=False):
    """What a transition (``WorkloadBook.transition``, ``end``) or an amendment (``amend``) may set on a workload
    besides its state: the fields of ``WorkloadRecord`` less the book's fixed ones (book.py ``_FIXED_FIELDS``: identity,
    what was asked, what the book keeps itself), each with its field's type. tests/management/workloads/test_states.py
    keeps the two lists in step with the record."""

    attempts: int
    scheduled_at: float | None
    started_at: float | None
    finished_at: float | None
    assignments: list[Assignment]
    restarts: int
    preemptions: int
    preempted_for: str
    exit_codes: list[int]
    host_failure: str
    start_failed_on: list[str]
    network: str
    overlay_issued: list[str]
    detail: str
    sealed_registry_password: str


def allowed_events(state: str) -> Mapping[str, str]:
    """The events ``state`` takes, each with the state it leads to (for an error message or a UI)."""
    return {event: target for (source, event), target in WORKLOAD.table.items() if source == state}
