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
    modules = sorted(API.rglob("*.py"))
    assert len(modules) >= 10
    for module in modules:
        tree = ast.parse(module.read_text())
        assert master_attributes_used(tree) == [], module.name
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.startswith(MASTER_INSIDES)], module.name


def test_the_check_itself_finds_a_handler_reaching_into_the_registry():
    tree = ast.parse("async def handler(request):\n    return request.app[KEY].master.registry.agents\n")
    assert master_attributes_used(tree) == ["master.registry (line 2)"]


MANAGEMENT = API.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return found | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}


def importers_of(prefix: str, paths: list[Path]) -> list[str]:
    return sorted(
        f"{path.relative_to(MANAGEMENT.parent) if path.is_relative_to(MANAGEMENT.parent) else path.name} imports {name}"
        for path in paths
        for name in imported_modules(path)
        if name == prefix or name.startswith(prefix + ".")
    )


def test_the_console_and_the_shared_pieces_import_nothing_of_the_api_so_there_is_no_cycle():
    """The API adds the console to its app; the console shares access control (management/access_control.py), the
    HTTP pieces (management/http/) and the answers (management/views/) with the API, never the API's own modules, so
    neither imports the other lazily."""
    console = sorted((MANAGEMENT / "console").rglob("*.py"))
    shared = [
        *sorted((MANAGEMENT / "http").rglob("*.py")),
        MANAGEMENT / "access_control.py",
        *sorted((MANAGEMENT / "views").rglob("*.py")),
    ]
    assert len(console) >= 10 and all(path.exists() for path in shared)
    assert importers_of("management.api", console + shared) == []
    assert importers_of("management.console", shared) == []


def test_no_service_imports_an_answer():
    """Services return records and dataclasses; the answers (management/views/) are built from them by the API and the
    console. A service that imported one would be building a view, and management/views/ imports the services."""
    services = sorted((MANAGEMENT / "services").rglob("*.py"))
    assert len(services) >= 10
    assert importers_of("management.views", services) == []


def test_only_the_api_the_console_and_the_composition_root_import_an_answer():
    """Beyond services/: the endpoints', payments', market's, workloads' and monitoring's modules return records too;
    the answers are the API's and the console's (app.py, the composition root, hands a builder to a webhook sender)."""
    readers = ("api", "console", "views")
    others = [
        path
        for path in sorted(MANAGEMENT.rglob("*.py"))
        if path.relative_to(MANAGEMENT).parts[0] not in readers and path != MANAGEMENT / "app.py"
    ]
    assert len(others) > 100
    assert importers_of("management.views", others) == []


def test_the_import_check_finds_a_console_page_importing_the_api(tmp_path):
    page = tmp_path / "page.py"
    page.write_text("from management.api.auth import scope_of\n")
    assert importers_of("management.api", [page]) == ["page.py imports management.api.auth"]


def test_every_answer_a_route_declares_is_a_struct_of_management_views():
    """Issue 38, point 2: an answer's struct lives with the functions that build it (management/views/), not in an API
    module beside a dict built elsewhere."""
    from management.api.routing import ROUTES

    elsewhere = sorted(
        f"{route.method} {route.path} {status}: {answer.__module__}.{answer.__qualname__}"
        for route in ROUTES
        for status, answer in route.answers.items()
        if answer is not None and not answer.__module__.startswith("management.views.")
    )
    assert len(ROUTES) > 50
    assert elsewhere == []
