"""Workload states as a transition table, and the checks a spec must pass against the Master's configuration.

Pure: no I/O. ``WorkloadBook`` (book.py) applies these transitions to stored records and records each one.

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
from collections.abc import Collection, Mapping

from common.catalog import CATALOG
from common.errors import IdlegridError
from master.records import WorkloadSpec
from master.states import StateMachine
from master.tiers import TierPolicy


class WorkloadState(str, enum.Enum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"  # placed: hosts and GPUs chosen, create commands issued
    STARTING = "starting"  # the agents acknowledged; containers are being created
    RUNNING = "running"
    PREEMPTED = "preempted"  # stopped for a higher priority; goes back to the queue
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


W = WorkloadState


def _table(rows: list[tuple[list[WorkloadState], str, WorkloadState]]) -> dict[tuple[str, str], str]:
    return {(source.value, event): target.value for sources, event, target in rows for source in sources}


FINAL_WORKLOAD_STATES = frozenset({W.SUCCEEDED.value, W.FAILED.value, W.CANCELLED.value})
OPEN_WORKLOAD_STATES = frozenset(s.value for s in W) - FINAL_WORKLOAD_STATES
WORKLOAD_STATES = tuple(s.value for s in W)

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

# The priority classes every Master knows, lowest first; the scheduler's policy may define its own.
DEFAULT_PRIORITY_CLASSES: tuple[str, ...] = ("low", "normal", "high", "critical")


class InvalidWorkloadSpec(IdlegridError):
    """A workload spec that names something this Master does not have (a GPU model, a tier, a priority class)."""

    code = "invalid_workload_spec"


def check_spec(spec: WorkloadSpec, *, policy: TierPolicy, priority_classes: Collection[str]) -> None:
    """Refuse what a spec names that is not configured here, naming the field; InvalidWorkloadSpec."""
    unknown_models = [m for m in spec.replica.models if m not in CATALOG]
    if unknown_models:
        raise InvalidWorkloadSpec(
            f"replica.models: unknown GPU model {', '.join(map(repr, unknown_models))}; "
            "use catalog keys such as 'h100-sxm' (GET /api/v1/tiers lists what is sold)"
        )
    tiers = [t.name for t in policy.tiers]
    unknown_tiers = [t for t in spec.replica.tiers if t not in tiers]
    if unknown_tiers:
        raise InvalidWorkloadSpec(
            f"replica.tiers: unknown tier {', '.join(map(repr, unknown_tiers))}; the tiers are: {', '.join(tiers)}"
        )
    if spec.priority not in priority_classes:
        raise InvalidWorkloadSpec(
            f"priority: unknown priority class {spec.priority!r}; the classes are: {', '.join(priority_classes)}"
        )
    if spec.replica.mig_profile is not None and spec.replica.gpus != 1:
        raise InvalidWorkloadSpec("replica.gpus: a replica with a mig_profile takes exactly one MIG instance (gpus = 1)")


def container_name(workload_id: str, replica: int, attempt: int) -> str:
    """The name of a replica's container on its host, the same every time it is asked: ``wl-<hex>-r<n>-a<n>``.

    Valid per common/containers.py's pattern (letters, digits, ``_.-``; 63 characters at most).
    """
    return f"{workload_id}-r{replica}-a{attempt}"


def allowed_events(state: str) -> Mapping[str, str]:
    """The events ``state`` takes, each with the state it leads to (for an error message or a UI)."""
    return {event: target for (source, event), target in WORKLOAD.table.items() if source == state}
