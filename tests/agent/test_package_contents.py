"""What ships in the provider's package: the agent, not the fleet simulator or benchmark instrumentation."""

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(AGENT.rglob("*.py"))]


def test_nothing_under_agent_imports_bench():
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name} imports {name}" for name in names if name.split(".")[0] == "bench"]
    assert offenders == []


def test_nothing_under_agent_hooks_the_garbage_collector():
    # gc.callbacks instrumentation is the fleet simulator's (bench/fleet_agents.py), never a provider host's.
    offenders = [
        path.name
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "callbacks" and getattr(node.value, "id", "") == "gc"
    ]
    assert offenders == []


def test_the_fleet_simulator_is_not_in_the_agent_package():
    assert not (AGENT / "fleet.py").exists()
