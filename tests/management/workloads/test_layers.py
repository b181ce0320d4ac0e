"""The workload's layers, as imports: the states, the spec and the lifecycle step are pure (no I/O module, no clock),
and placement (management/scheduler/) uses only the workload's states and spec, never the book, step or runner."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PURE = ("state_names.py", "states.py", "spec.py", "lifecycle.py")
IO_MODULES = (
    "asyncio",
    "time",
    "aiohttp",
    "websockets",
    "sqlite3",
    "master.master",
    "master.store",
    "management.workloads.book",
)
PLACEMENT_MAY_USE = ("management.workloads.states", "management.workloads.spec")


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_states_the_spec_and_the_lifecycle_step_import_no_io():
    for name in PURE:
        used = imports(ROOT / "management" / "workloads" / name)
        bad = sorted(m for m in used if any(m == io or m.startswith(io + ".") for io in IO_MODULES))
        assert not bad, f"management/workloads/{name} is pure but imports {bad}"


def test_placement_uses_only_the_workloads_states_and_spec():
    for path in sorted((ROOT / "management" / "scheduler").glob("*.py")):
        bad = sorted(m for m in imports(path) if m.startswith("management.workloads") and m not in PLACEMENT_MAY_USE)
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: placement must not reach the book, step or runner"
