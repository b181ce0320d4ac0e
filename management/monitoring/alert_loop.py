"""The alert loop: a small named loop (master/loops.py) in the Master's process that, every evaluation period,
reads the fleet (observe.py), runs the pure evaluator, records each transition as an ``alert.firing`` /
``alert.resolved`` event, hands it to the webhook notifier (unless silenced) and, for a rule of the fault class,
marks the GPU faulty through the Master's fault path (the scheduler reallocates off faulty GPUs) and clears that
fault when the alert resolves.

At fleet scale the observer hands over only the subjects that breach or have an alert (observe.py), and the loop
evaluates them in slices of ``EVALUATION_SLICE`` series, yielding to the event loop between slices, so that an
evaluation with thousands of breaching GPUs does not hold the Master's loop (``evaluate_in_slices``: the same
result as one call).

Alert states live in memory: a Master restart starts them again from the fleet's current values (a condition
still holding fires again, with a new idempotency key).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from management.monitoring.evaluator import FIRING, RESOLVED, AlertState, AlertTransition, Evaluation, Series, evaluate
from management.monitoring.notifier import WebhookNotifier
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import AlertRule
from management.monitoring.silences import SilenceBook
from master.port import GpuFault, Loop, stop_loop

log = logging.getLogger(__name__)

ALERT_FAULT = "alert"  # GpuFault.kind of a fault an alert rule set
_FAULT_PREFIX = "alert "  # its reason: "alert <rule>: <summary>"


def _rule_of_fault(fault: GpuFault) -> str | None:
    """The rule that set ``fault``; None for a fault the Master set (Xid, ECC, overheating)."""
    if fault.kind != ALERT_FAULT or not fault.reason.startswith(_FAULT_PREFIX):
        return None
    return fault.reason.removeprefix(_FAULT_PREFIX).partition(":")[0]


RECENT_TRANSITIONS = 1000
EVALUATION_SLICE = 2000  # series evaluated between two yields to the event loop


async def evaluate_in_slices(
    rules: Sequence[AlertRule],
    series: Sequence[Series],
    states: Mapping[tuple[str, str], AlertState],
    now: float,
    *,
    slice_size: int = EVALUATION_SLICE,
) -> Evaluation:
    """``evaluate`` over slices of ``series``, yielding to the event loop between them, with the same result.

    The evaluator judges each (rule, subject) on its own: each slice gets the states of its own subjects, and the
    states whose subject is in no slice go, with no series, to a last call (a firing one resolves, a pending one is
    dropped) together with any state of a rule no longer given."""
    if len(series) <= slice_size:
        return evaluate(rules, series, states, now)
    metric_of = {rule.name: rule.metric for rule in rules}
    slices = [series[start : start + slice_size] for start in range(0, len(series), slice_size)]
    slice_of = {(one.metric, one.subject): number for number, part in enumerate(slices) for one in part}
    slice_states: list[dict[tuple[str, str], AlertState]] = [{} for _ in range(len(slices) + 1)]
    for key, state in states.items():
        metric = metric_of.get(key[0])
        number = len(slices) if metric is None else slice_of.get((metric, key[1]), len(slices))
        slice_states[number][key] = state
    out: dict[tuple[str, str], AlertState] = {}
    transitions: list[AlertTransition] = []
    for part, part_states in zip([*slices, []], slice_states, strict=True):
        if not part and not part_states:
            continue
        result = evaluate(rules, part, part_states, now)
        out.update(result.states)
        transitions.extend(result.transitions)
        await asyncio.sleep(0)
    return Evaluation(states=out, transitions=transitions)


LOOP_NAME = "alerts"


@dataclass
class AlertLoop:
    observer: FleetObserver
    rules: list[AlertRule]
    notifier: WebhookNotifier = field(default_factory=WebhookNotifier)
    silences: SilenceBook = field(default_factory=SilenceBook)
    period_s: float = 15.0
    clock: Callable[[], float] = time.time
    states: dict[tuple[str, str], AlertState] = field(default_factory=dict)
    recent: deque[AlertTransition] = field(default_factory=lambda: deque(maxlen=RECENT_TRANSITIONS))
    _task: asyncio.Task[None] | None = None
    _adopted: bool = False

    def start(self) -> None:
        self.observer.watch(self.rules)
        self.observer.attach()
        self.notifier.start()
        self._task = Loop(LOOP_NAME, self.period_s, self._step, restart_s=self.period_s).start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None
        self.observer.detach()
        await self.notifier.stop()

    async def _step(self) -> None:
        await self.step()

    async def step(self) -> list[AlertTransition]:
        """One evaluation now; the transitions it made."""
        now = self.clock()
        if not self._adopted:
            self._adopt_alert_faults()
        rules = list(self.rules)
        series = self.observer.collect(rules, now, self.states.keys())
        result = await evaluate_in_slices(rules, series, self.states, now)
        self.states = result.states
        if not result.transitions:
            return []
        master = self.observer.master
        await master.record_events([(f"alert.{t.phase}", t.subject, msgspec.to_builtins(t)) for t in result.transitions])
        by_name = {rule.name: rule for rule in rules}
        for transition in result.transitions:
            self.recent.append(transition)
            if not self.silences.silenced(transition, now):
                self.notifier.notify(transition)
            rule = by_name.get(transition.rule)
            if transition.phase == FIRING and rule is not None and rule.fault:
                await self._mark_faulty(rule, transition)
            elif transition.phase == RESOLVED:
                await self._clear_fault(transition)
        return result.transitions

    async def _mark_faulty(self, rule: AlertRule, transition: AlertTransition) -> None:
        master = self.observer.master
        gpu = master.registry.gpus.get(transition.subject)
        if gpu is None or gpu.fault is not None:
            return  # a fault already stands (the first cause stands, as in master/faults.py)
        reason = f"{_FAULT_PREFIX}{rule.name}: {rule.summary or rule.metric}"
        code = None if transition.value is None else round(transition.value)
        await master.mark_gpu_faulty(gpu, GpuFault(kind=ALERT_FAULT, reason=reason, since=transition.at, code=code))

    async def _clear_fault(self, transition: AlertTransition) -> None:
        """The fault this alert set, and no other, is cleared when it resolves (even if its rule was removed)."""
        master = self.observer.master
        gpu = master.registry.gpus.get(transition.subject)
        if gpu is not None and gpu.fault is not None and _rule_of_fault(gpu.fault) == transition.rule:
            await master.clear_gpu_fault(gpu, f"alert {transition.rule} resolved")

    def _adopt_alert_faults(self) -> None:
        """After a restart, the GPUs an alert marked faulty (the fault is stored, the alert's state was not) have
        their alert firing again, from the fault's time, so that it resolves, and clears the fault, when it should."""
        self._adopted = True
        for gpu in self.observer.master.registry.gpus.values():
            rule = None if gpu.fault is None else _rule_of_fault(gpu.fault)
            if gpu.fault is None or rule is None or (rule, gpu.uuid) in self.states:
                continue
            value = float(gpu.fault.code) if gpu.fault.code is not None else 0.0
            host = self.observer.master.registry.agents.get(gpu.agent_id)
            labels = {"agent_id": gpu.agent_id, "gpu": gpu.uuid, "provider": host.provider if host is not None else ""}
            self.states[(rule, gpu.uuid)] = AlertState(
                rule=rule,
                subject=gpu.uuid,
                phase=FIRING,
                since=gpu.fault.since,
                value=value,
                fired_at=gpu.fault.since,
                labels=labels,
            )

    def firing(self) -> list[AlertState]:
        return sorted((s for s in self.states.values() if s.phase == FIRING), key=lambda s: (s.since, s.rule, s.subject))

    def replace_rules(self, rules: Sequence[AlertRule]) -> None:
        """New rules from the next evaluation on; alerts of a rule that is gone resolve then."""
        self.rules = list(rules)
        self.observer.watch(self.rules)
