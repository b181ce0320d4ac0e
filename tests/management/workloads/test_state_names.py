"""Issue 38, point 2: the states have one home each (management/workloads/state_names.py for a workload's and its
replicas', master/states.py for an agent's, a GPU's and a command's, management/endpoints/queue.py for an
endpoint request's), the GPU-holding workload states are one set, and code compares a state through its enum, never
with a literal (a literal misspelt, or a state renamed, compares unequal silently; a member misspelt fails the import
and mypy).

Read from the source, like tests/test_dependency_rule.py."""

from __future__ import annotations

import ast
from pathlib import Path

from management.endpoints.queue import RequestState
from management.workloads.state_names import HOLDING_STATES, AssignmentState, WorkloadState
from master.states import AgentState, CommandState, GpuState

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("management", "master")
HOME = "management/workloads/state_names.py"
# "pending" is left out: a kept output's state (master/records.py OUTPUT_STATES) and a top-up's (a Literal that mypy
# checks) are "pending" too, and neither has an enum to compare through.
STATES = (WorkloadState, AssignmentState, AgentState, GpuState, CommandState, RequestState)
STATE_VALUES = {str(s.value) for enum in STATES for s in enum}
STATE_VALUES -= {"pending"}
ENUM_NAMES = {"W", "WorkloadState", "A", "AssignmentState"}


def _is_state(node: ast.expr) -> bool:
    """``rec.state``, ``state``, ``x.gpu_state``, ``workload["state"]``, ``workload.get("state")``."""
    match node:
        case ast.Attribute(attr=name) | ast.Name(id=name):
            return name.endswith("state")
        case ast.Subscript(slice=ast.Constant(value="state")):
            return True
        case ast.Call(func=ast.Attribute(attr="get"), args=[ast.Constant(value="state"), *_]):
            return True
    return False


def _literals(node: ast.expr) -> set[str]:
    """The strings a comparison's side spells out: ``"running"``, ``("succeeded", "failed")``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def literal_state_comparisons(source: str, shown: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_state(side) for side in sides) and any(_literals(side) & STATE_VALUES for side in sides):
                found.append((node.lineno, f"{shown}:{node.lineno}: {ast.unparse(node)}"))
    return [line for _, line in sorted(found)]


def _workload_states(node: ast.expr) -> set[str]:
    """The workload states a set, tuple or list display names, as members (``W.RUNNING``) or as literals."""
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set()
    named = set()
    for e in node.elts:
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in ENUM_NAMES:
            named.add(e.attr.lower())
        elif isinstance(e, ast.Constant) and isinstance(e.value, str):
            named.add(e.value)
    return named


def holding_sets(source: str, shown: str) -> list[str]:
    """Each display of exactly the GPU-holding states: a second copy of ``HOLDING_STATES``."""
    copies = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.expr) and _workload_states(n) == HOLDING_STATES]
    return [f"{shown}:{node.lineno}: {ast.unparse(node)}" for node in sorted(copies, key=lambda n: n.lineno)]


def _modules() -> list[tuple[str, str]]:
    return [
        (path.relative_to(ROOT).as_posix(), path.read_text())
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_states_are_compared_through_their_enum_never_a_literal() -> None:
    found = [line for shown, source in _modules() for line in literal_state_comparisons(source, shown)]
    assert found == [], "compare with the member (rec.state == W.RUNNING) or a set of state_names.py: " + "; ".join(found)


def test_the_gpu_holding_states_are_one_set_in_one_home() -> None:
    found = [line for shown, source in _modules() if shown != HOME for line in holding_sets(source, shown)]
    assert found == [], f"import HOLDING_STATES from {HOME}: " + "; ".join(found)
    w = WorkloadState
    assert {str(s) for s in (w.SCHEDULED, w.STARTING, w.RUNNING, w.PREEMPTED)} == HOLDING_STATES
    # The two places the issue found a copy in (workloads/runner.py's ``_STEPPED``, scheduler/snapshot.py's) read it.
    for user in ("management/workloads/runner.py", "management/scheduler/snapshot.py"):
        tree = ast.parse((ROOT / user).read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("management.workloads.state")
            for alias in node.names
        }
        assert "HOLDING_STATES" in imported, f"{user} reads the GPU-holding states from {HOME}"


def test_the_scans_find_a_literal_comparison_and_a_copied_set() -> None:
    source = (
        "def f(rec, workload, agent, kept):\n"
        '    a = rec.state == "running"\n'
        '    b = workload["state"] not in ("succeeded", "failed")\n'
        '    c = agent.state != "retired"\n'
        '    d = kept.state == "pending"\n'  # a kept output's: no enum
        "    e = rec.state == W.RUNNING\n"
        "HOLD = frozenset({W.SCHEDULED, W.STARTING, W.RUNNING, W.PREEMPTED})\n"
        'ALSO = ("scheduled", "starting", "running", "preempted")\n'
        "PLACED = (W.SCHEDULED, W.STARTING)\n"
    )
    assert literal_state_comparisons(source, "m.py") == [
        "m.py:2: rec.state == 'running'",
        "m.py:3: workload['state'] not in ('succeeded', 'failed')",
        "m.py:4: agent.state != 'retired'",
    ]
    assert [line.split(":")[1] for line in holding_sets(source, "m.py")] == ["7", "8"]
