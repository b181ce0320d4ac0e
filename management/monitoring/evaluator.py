"""Alert evaluation as a pure function: rules, recent values, the alerts' state and ``now`` in; the new state and
the transitions out. No clock, no I/O: the loop (management/monitoring/alert_loop.py) supplies everything.

States of one alert (one rule about one subject: a GPU, a host...):

- none: the condition does not hold;
- ``pending``: it holds, since the first sample of the current run of breaching samples, for less than ``for_s``;
- ``firing``: it held for ``for_s`` (announced: a ``firing`` transition);
- resolved: a firing alert whose condition, against the clear threshold, has not held for ``clear_for_s``
  (announced: a ``resolved`` transition), or whose subject is no longer reported. The state is dropped.

Invariants: a pending alert that stops breaching is dropped without a transition; a firing alert only resolves on
values past the clear threshold, so a value oscillating between the two thresholds never fires twice; an alert
fires at the first evaluation at or after ``since + for_s`` (at most one evaluation period late).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from management.monitoring.rules import AlertRule

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"

Point = tuple[float, float]  # (ts, value)


class Series(msgspec.Struct, frozen=True, kw_only=True):
    """Recent values of one metric about one subject, oldest first; ``labels`` say whose it is (owner, renter...)."""

    metric: str
    subject: str
    points: tuple[Point, ...]
    labels: dict[str, str] = {}


class AlertState(msgspec.Struct, frozen=True, kw_only=True):
    rule: str
    subject: str
    phase: str  # PENDING | FIRING
    since: float  # the condition holds since
    value: float
    fired_at: float | None = None
    clear_since: float | None = None  # firing, and clear since
    labels: dict[str, str] = {}

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.subject)


class AlertTransition(msgspec.Struct, frozen=True, kw_only=True):
    """An alert fired or resolved. ``key`` is the same for every delivery of this one transition (idempotency)."""

    key: str
    rule: str
    subject: str
    phase: str  # FIRING | RESOLVED
    at: float
    since: float  # when the condition began to hold
    fired_at: float
    value: float | None  # None: the subject is no longer reported
    severity: str
    scope: str
    summary: str
    labels: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class Evaluation:
    states: dict[tuple[str, str], AlertState]
    transitions: list[AlertTransition] = field(default_factory=list)


def _run_start(points: Sequence[Point], holds: Callable[[float], bool]) -> tuple[float, bool] | None:
    """The first ts of the trailing run of points for which ``holds``, and whether that run is the whole window;
    None when the latest point does not hold."""
    start: float | None = None
    for index in range(len(points) - 1, -1, -1):
        ts, value = points[index]
        if not holds(value):
            return None if start is None else (start, False)
        start = ts
    return None if start is None else (start, True)


def _transition(rule: AlertRule, state: AlertState, phase: str, now: float, value: float | None) -> AlertTransition:
    fired_at = state.fired_at if state.fired_at is not None else now
    return AlertTransition(
        key=f"{rule.name}/{state.subject}/{fired_at:.3f}/{phase}",
        rule=rule.name,
        subject=state.subject,
        phase=phase,
        at=now,
        since=state.since,
        fired_at=fired_at,
        value=value,
        severity=rule.severity,
        scope=rule.scope,
        summary=rule.summary,
        labels=state.labels,
    )


def evaluate(
    rules: Sequence[AlertRule],
    series: Sequence[Series],
    states: Mapping[tuple[str, str], AlertState],
    now: float,
) -> Evaluation:
    """One evaluation at ``now``. Points later than ``now`` are not seen. Alerts of rules no longer given resolve."""
    by_metric: dict[str, list[Series]] = {}
    for one in series:
        by_metric.setdefault(one.metric, []).append(one)
    out: dict[tuple[str, str], AlertState] = {}
    transitions: list[AlertTransition] = []
    seen: set[tuple[str, str]] = set()
    rule_names = {rule.name for rule in rules}
    for rule in rules:
        for one in by_metric.get(rule.metric, ()):
            key = (rule.name, one.subject)
            seen.add(key)
            points = [p for p in one.points if p[0] <= now]
            prior = states.get(key)
            if not points:
                if prior is not None and prior.phase == FIRING:
                    transitions.append(_transition(rule, prior, RESOLVED, now, None))
                continue
            latest = points[-1][1]
            if prior is None or prior.phase == PENDING:
                run = _run_start(points, rule.breached)
                if run is None:
                    continue  # not breaching (a pending alert is dropped, unannounced)
                start, whole = run
                since = min(prior.since, start) if prior is not None and whole else start
                state = AlertState(
                    rule=rule.name, subject=one.subject, phase=PENDING, since=since, value=latest, labels=one.labels
                )
                if now - since >= rule.for_s:
                    state = msgspec.structs.replace(state, phase=FIRING, fired_at=now)
                    transitions.append(_transition(rule, state, FIRING, now, latest))
                out[key] = state
                continue
            # firing: does it clear?
            clear = _run_start(points, rule.cleared)
            if clear is None:
                out[key] = msgspec.structs.replace(prior, value=latest, clear_since=None, labels=one.labels)
                continue
            start, whole = clear
            clear_since = min(prior.clear_since, start) if prior.clear_since is not None and whole else start
            if now - clear_since >= rule.clear_for_s:
                transitions.append(_transition(rule, prior, RESOLVED, now, latest))
            else:
                out[key] = msgspec.structs.replace(prior, value=latest, clear_since=clear_since, labels=one.labels)
    rule_by_name = {rule.name: rule for rule in rules}
    for key, prior in states.items():
        if key in seen or prior.phase != FIRING:
            continue
        if prior.rule in rule_names:
            transitions.append(_transition(rule_by_name[prior.rule], prior, RESOLVED, now, None))  # no longer reported
        else:
            gone = AlertRule(name=prior.rule, metric="", op=">", threshold=0, summary="the rule was removed")
            transitions.append(_transition(gone, prior, RESOLVED, now, None))
    return Evaluation(states=out, transitions=transitions)
