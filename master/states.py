"""State machines of agents, GPUs and commands, as explicit transition tables.

Each machine is a table ``(state, event) -> next state``; ``transition`` is a pure function over it.
The registry records every transition it applies as an event in the store.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import InvalidTransition


class AgentState(str, enum.Enum):
    ENROLLED = "enrolled"
    READY = "ready"
    BUSY = "busy"
    MAINTENANCE = "maintenance"
    OFFLINE = "offline"
    QUARANTINED = "quarantined"
    RETIRED = "retired"


class GpuState(str, enum.Enum):
    AVAILABLE = "available"
    RESERVED = "reserved"
    BUSY = "busy"
    FAULTY = "faulty"
    OFFLINE = "offline"


class CommandState(str, enum.Enum):
    PENDING = "pending"
    SENT = "sent"
    ACKED = "acked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


FINAL_COMMAND_STATES = frozenset({CommandState.SUCCEEDED, CommandState.FAILED, CommandState.TIMED_OUT, CommandState.CANCELLED})


@dataclass(frozen=True)
class StateMachine:
    name: str
    table: Mapping[tuple[str, str], str]

    def next(self, state: str, event: str) -> str:
        try:
            return self.table[(state, event)]
        except KeyError:
            raise InvalidTransition(f"{self.name}: no transition from {state!r} on {event!r}") from None

    def allows(self, state: str, event: str) -> bool:
        return (state, event) in self.table

    def events(self) -> set[str]:
        return {event for _, event in self.table}

    def path(self, state: str, target: str) -> list[str]:
        """The shortest list of events that leads from ``state`` to ``target`` ([] when already there).

        Raises InvalidTransition when the table offers no way there.
        """
        frontier, seen = [(state, list[str]())], {state}
        while frontier:
            following = []
            for current, events in frontier:
                if current == target:
                    return events
                for (source, event), nxt in self.table.items():
                    if source == current and nxt not in seen:
                        seen.add(nxt)
                        following.append((nxt, [*events, event]))
            frontier = following
        raise InvalidTransition(f"{self.name}: no way from {state!r} to {target!r}")


def _table(rows: list[tuple[list[enum.Enum], str, enum.Enum]]) -> dict[tuple[str, str], str]:
    table: dict[tuple[str, str], str] = {}
    for sources, event, target in rows:
        for source in sources:
            table[(source.value, event)] = target.value
    return table


A = AgentState
AGENT = StateMachine(
    "agent",
    _table(
        [
            ([A.ENROLLED, A.OFFLINE], "connected", A.READY),
            ([A.READY], "workload_started", A.BUSY),
            ([A.BUSY], "workload_finished", A.READY),
            ([A.ENROLLED, A.READY, A.BUSY, A.OFFLINE], "drain", A.MAINTENANCE),
            ([A.MAINTENANCE], "undrain", A.READY),
            ([A.ENROLLED, A.READY, A.BUSY, A.MAINTENANCE], "heartbeat_lost", A.OFFLINE),
            ([A.ENROLLED, A.READY, A.BUSY, A.MAINTENANCE], "disconnected", A.OFFLINE),  # a clean stop, a lost relay
            ([A.ENROLLED, A.READY, A.BUSY, A.MAINTENANCE, A.OFFLINE], "quarantine", A.QUARANTINED),
            ([A.QUARANTINED], "release", A.OFFLINE),
            ([A.ENROLLED, A.READY, A.BUSY, A.MAINTENANCE, A.OFFLINE, A.QUARANTINED], "revoke", A.RETIRED),
        ]
    ),
)

G = GpuState
GPU = StateMachine(
    "gpu",
    _table(
        [
            ([G.AVAILABLE], "reserve", G.RESERVED),
            ([G.RESERVED], "release", G.AVAILABLE),
            ([G.AVAILABLE, G.RESERVED], "start", G.BUSY),
            ([G.BUSY], "finish", G.AVAILABLE),
            ([G.AVAILABLE, G.RESERVED, G.BUSY, G.OFFLINE], "fault", G.FAULTY),
            ([G.FAULTY], "repair", G.AVAILABLE),
            ([G.AVAILABLE, G.RESERVED, G.BUSY, G.FAULTY], "lost", G.OFFLINE),
            ([G.OFFLINE], "restored", G.AVAILABLE),
        ]
    ),
)

C = CommandState
COMMAND = StateMachine(
    "command",
    _table(
        [
            ([C.PENDING], "send", C.SENT),
            ([C.PENDING, C.SENT], "ack", C.ACKED),
            ([C.PENDING, C.SENT, C.ACKED], "succeed", C.SUCCEEDED),
            ([C.PENDING, C.SENT, C.ACKED], "fail", C.FAILED),
            ([C.PENDING, C.SENT, C.ACKED], "expire", C.TIMED_OUT),
            ([C.PENDING, C.SENT], "cancel", C.CANCELLED),
        ]
    ),
)
