"""An offer's history, for a renter deciding whether to rent it: the host's prices over time and when it was there to
rent. Pure: the façade reads the events (``price.changed``, ``agent.transition``) and hands them in as plain values.

- **Prices**: each ``price.changed`` event of the host (its own price set or cleared) or of its provider (the default,
  which a host without its own takes) is a point; ``price_points`` keeps the ones that changed what the host charged,
  in time order, and says where each came from. A host price outranks its provider's default while it is set.
- **Availability**: the host's state transitions cut a window (the last ``window_s`` up to ``now``) into spans of one
  state each; ``available_share`` is the share of the window's time spent in a state that offers (ready or busy). The
  state before the first transition in the window is the one that transition left (``old``); a host with no
  transition at all is in the state it is in now for the whole window. A span never starts before the host enrolled
  (its first transition), so a host that joined yesterday is judged on the time since.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OFFERING_STATES = frozenset({"ready", "busy"})  # master/states.py AgentState: the states an offer exists in


@dataclass(frozen=True, slots=True)
class PriceChange:
    """One ``price.changed`` event, as the façade read it: for a host (``agent_id``) or a provider's default ("")."""

    at: float
    agent_id: str  # "" for the provider's default
    on_demand: int | None  # micro-units per GPU-hour; None: the host's own price was cleared
    min_bid: int | None
    reserved: int | None


@dataclass(frozen=True, slots=True)
class PricePoint:
    """From ``at`` on, the host charged this (micro-units per GPU-hour), set by ``source`` ("host" or "provider")."""

    at: float
    on_demand: int
    min_bid: int | None
    reserved: int
    source: str


def price_points(changes: Iterable[PriceChange]) -> list[PricePoint]:
    """The prices the host charged over time: its own while set, else its provider's default; a change that did not
    alter what the host charged (a default changed while the host had its own) makes no point."""
    own: PriceChange | None = None
    default: PriceChange | None = None
    points: list[PricePoint] = []
    for change in sorted(changes, key=lambda c: c.at):
        if change.agent_id:
            own = change if change.on_demand is not None else None
        else:
            default = change
        shown = own if own is not None else default
        if shown is None or shown.on_demand is None:
            continue
        point = PricePoint(
            at=change.at,
            on_demand=shown.on_demand,
            min_bid=shown.min_bid,
            reserved=shown.reserved if shown.reserved is not None else shown.on_demand,
            source="host" if shown is own else "provider",
        )
        if not points or (points[-1].on_demand, points[-1].min_bid, points[-1].reserved, points[-1].source) != (
            point.on_demand,
            point.min_bid,
            point.reserved,
            point.source,
        ):
            points.append(point)
    return points


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class StateSpan:
    start: float
    end: float
    state: str

    @property
    def offering(self) -> bool:
        return self.state in OFFERING_STATES


def state_spans(transitions: Sequence[Transition], *, state_now: str, now: float, window_s: float) -> list[StateSpan]:
    """The window ``[now - window_s, now]`` cut into spans of one state each (``transitions`` in time order)."""
    since = now - window_s
    if transitions:
        since = max(since, transitions[0].at)  # nothing is known of the host before its first transition
    state = state_now
    for t in transitions:  # the state at ``since``: the one the first transition after it left
        if t.at > since:
            state = t.old
            break
        state = t.new
    spans: list[StateSpan] = []
    start = since
    for t in transitions:
        if t.at <= since or t.at > now:
            continue
        if t.at > start:
            spans.append(StateSpan(start, t.at, state))
        start, state = t.at, t.new
    if now > start:
        spans.append(StateSpan(start, now, state))
    return spans


def available_share(spans: Sequence[StateSpan]) -> float | None:
    """The share of the spans' time in an offering state, 0..1; None when they cover no time."""
    total = sum(s.end - s.start for s in spans)
    if total <= 0:
        return None
    return sum(s.end - s.start for s in spans if s.offering) / total
