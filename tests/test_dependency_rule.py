"""DESIGN.md's dependency rule, checked on every import statement in the five packages."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"common", "agent", "access", "master", "management"}
ALLOWED = {
    "common": set(),
    "agent": {"common"},
    "access": {"common"},
    "master": {"common"},
    "management": {"master", "common"},
}


def _entry_points() -> set[Path]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {ROOT / (target.split(":")[0].replace(".", "/") + ".py") for target in scripts.values()}


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & PACKAGES


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
# other management module reaches the Master through master/port.py alone.
ENTRY_POINTS = {"management/app.py", "management/cli.py", "management/localgrid.py"}


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
        violations += [f"{name} imports {module}" for module in sorted(_master_modules(path) - {"master.port"})]
    assert violations == [], "management uses the Master through master/port.py (MasterPort) only"
