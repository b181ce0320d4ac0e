"""The scheduler: a pure core (snapshot in, decisions out) and, around it, the loop that carries them out.

See docs/scheduler.md.
"""

from management.scheduler.core import explain, reserved_start, schedule
from management.scheduler.model import (
    Constraints,
    Explanation,
    FilterCount,
    Host,
    Job,
    Place,
    Plan,
    Policy,
    Preempt,
    PriorityClass,
    Quota,
    QuotaCheck,
    Reject,
    ReplicaRequest,
    Requeue,
    Snapshot,
    Unit,
    add_usage,
    decay,
)
from management.scheduler.pool import FreePool

__all__ = [
    "Constraints",
    "Explanation",
    "FilterCount",
    "FreePool",
    "Host",
    "Job",
    "Place",
    "Plan",
    "Policy",
    "Preempt",
    "PriorityClass",
    "Quota",
    "QuotaCheck",
    "Reject",
    "ReplicaRequest",
    "Requeue",
    "Snapshot",
    "Unit",
    "add_usage",
    "decay",
    "explain",
    "reserved_start",
    "schedule",
]
