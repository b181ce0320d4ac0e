"""The workload's and its replicas' states as enums, and the sets of them code asks about: their one home.

Light on purpose, the standard library only: the command line compares a workload's state through these too, and it
must start without importing the Master (docs/cli.md, "Starting fast"). ``states.py`` adds the transition table and
re-exports everything here. The members are ``StrEnum``s whose values are the strings stored in records and sent on
the wire: a record's ``state`` is a plain string that compares equal to its member (``rec.state == W.RUNNING``), so
code compares with the member, never with a literal or ``.value``.
"""

from __future__ import annotations

import enum


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
FINAL_WORKLOAD_STATES = frozenset({str(W.SUCCEEDED), str(W.FAILED), str(W.CANCELLED)})
OPEN_WORKLOAD_STATES = frozenset(str(s) for s in W) - FINAL_WORKLOAD_STATES
WORKLOAD_STATES = tuple(str(s) for s in W)
# The states a workload holds (or is about to hold) GPUs in: a running job to the scheduler's core
# (scheduler/snapshot.py), and the states the lifecycle step decides in (workloads/runner.py).
HOLDING_STATES = frozenset(str(s) for s in (W.SCHEDULED, W.STARTING, W.RUNNING, W.PREEMPTED))
