"""The API's handlers never reach into the Master: they go through the services (management/services/).

Read from the source (like tests/test_dependency_rule.py): no attribute of anything named ``master`` is used
in management/api/, and no module of the Master's insides (registry, store, links, ledger) is imported there.
"""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "management" / "api"
MASTER_INSIDES = ("master.registry", "master.store", "master.link", "master.commands", "master.telemetry", "master.enrollment")
# Once the Master owns its metrics the API serves ``master.metrics.registry``: the one attribute it may read.
ALLOWED = {"metrics"}


def master_attributes_used(tree: ast.AST) -> list[str]:
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr not in ALLOWED:
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name.lstrip("_") == "master":
                used.append(f"{name}.{node.attr} (line {node.lineno})")
    return used


def test_no_handler_module_touches_the_masters_collaborators():
    modules = sorted(API.glob("*.py"))
    assert len(modules) >= 10
    for module in modules:
        tree = ast.parse(module.read_text())
        assert master_attributes_used(tree) == [], module.name
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.startswith(MASTER_INSIDES)], module.name


def test_the_check_itself_finds_a_handler_reaching_into_the_registry():
    tree = ast.parse("async def handler(request):\n    return request.app[KEY].master.registry.agents\n")
    assert master_attributes_used(tree) == ["master.registry (line 2)"]
