"""The dependency rule (README.md, "For developers"), checked on every import statement in the five packages, and the
narrower rules of the subpackages that talk to the management API from outside it: the command line and the clients."""

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"common", "agent", "access", "master", "management"}
ALLOWED = {
    "common": set(),
    "agent": {"common"},
    "access": {"common"},
    "master": {"common"},
    "management": {"master", "common"},
}


# Subpackages held to a narrower rule: each module (the entry point aside) imports only modules under these prefixes.
# The command line and the clients reach the Master through the API alone: no master internals, no services.
NARROWER = {
    "management/client": ("common", "management.client"),
    "management/cli": (
        "common",
        "management.cli",
        "management.client",
        "management.market.money",  # amounts as people type and read them: pure text <-> integers
        "management.workloads.explain_text",  # "why it waits" rendered from the API's answer: pure text
        "management.workloads.state_names",  # the workload's states as enums: the standard library only
        "master.port",  # WorkloadSpec and SpecJson alone: the spec's schema, checked before it is sent (it is the API's body)
    ),
    "agent/cli.py": ("common", "agent"),
}


def _entry_points() -> set[Path]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {ROOT / (target.split(":")[0].replace(".", "/") + ".py") for target in scripts.values()}


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _absolute_imports(path: Path) -> set[str]:
    """The top-level names of everything ``path`` imports by absolute name (relative imports left out)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _imported_packages(path: Path) -> set[str]:
    return _absolute_imports(path) & PACKAGES


def test_packages_import_only_what_the_design_allows():
    entry_points = _entry_points()
    violations = []
    for package, allowed in ALLOWED.items():
        for path in (ROOT / package).rglob("*.py"):
            if path in entry_points:
                continue  # the one place that composes every part
            for imported in _imported_packages(path) - allowed - {package}:
                violations.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert violations == []


def test_the_entry_point_exists():
    assert all(path.exists() for path in _entry_points())


# The entry points build a Master (or its files) themselves: the composition root, the CLI and the local grid. Every
# other management module reaches the Master through master/port.py alone, but management's own aggregates
# (management/store/), which are written against the store's plugin kit too (docs/store.md, "Who owns what").
ENTRY_POINTS = {"management/app.py", "management/cli/main.py", "management/devgrid/localgrid.py"}
STORE_PLUGINS = "management/store/"


def _master_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "master"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "master":
            found.add(node.module)
    return found


def test_management_imports_from_master_only_its_published_interface():
    violations = []
    for path in sorted((ROOT / "management").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name in ENTRY_POINTS:
            continue
        allowed = {"master.port", "master.store.kit"} if name.startswith(STORE_PLUGINS) else {"master.port"}
        violations += [f"{name} imports {module}" for module in sorted(_master_modules(path) - allowed)]
    assert violations == [], "management uses the Master through master/port.py (MasterPort) only"


def test_only_management_s_aggregates_import_the_store_s_plugin_kit():
    importing = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "management").rglob("*.py")
        if "master.store.kit" in _master_modules(path)
    )
    assert importing and all(name.startswith(STORE_PLUGINS) for name in importing)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("part", sorted(NARROWER))
def test_the_command_line_and_the_clients_import_only_what_they_need(part):
    entry_points = _entry_points()
    root = ROOT / part
    paths = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    assert paths and all(path.exists() for path in paths)
    violations = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in paths
        if path not in entry_points
        for module in sorted(_imported_modules(path))
        if not _within(module, NARROWER[part])
    ]
    assert violations == []


# Carried into renters' images, copied under any name: the standard library and its own folder (relative imports) only.
STANDALONE = ("common/endpoint_worker",)


@pytest.mark.parametrize("part", STANDALONE)
def test_the_worker_handler_library_imports_the_standard_library_alone(part):
    paths = sorted((ROOT / part).rglob("*.py"))
    assert paths
    violations = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in sorted(_absolute_imports(path) - set(sys.stdlib_module_names) - {"__future__"})
    ]
    assert violations == []


def test_a_standalone_module_that_imports_a_package_or_ours_is_caught(tmp_path):
    reaching = tmp_path / "reaching.py"
    reaching.write_text("import json\nfrom . import contract\nimport msgspec\nfrom common.wire import Hello\n")
    assert _absolute_imports(reaching) - set(sys.stdlib_module_names) == {"msgspec", "common"}


def test_a_module_under_the_narrower_rule_that_reaches_further_is_caught(tmp_path):
    reaching = tmp_path / "reaching.py"
    reaching.write_text("from management.services import Services\nimport master.master\nfrom common.errors import ConfigError\n")
    assert sorted(m for m in _imported_modules(reaching) if not _within(m, NARROWER["management/cli"])) == [
        "management.services",
        "master.master",
    ]
