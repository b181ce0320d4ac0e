"""Every module of the packages (and the benchmarks) imports. mypy runs with ``ignore_missing_imports`` for the
third-party libraries without stubs, which also hides an import of one of our own modules that moved away; this
catches it for modules no test imports (a benchmark, an entry point)."""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "agent", "access", "master", "management", "bench")


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            if "node_modules" in relative.parts or relative.name == "__main__":
                continue  # the console's npm tree; __main__ modules run their program when imported
            found.append(".".join(relative.parts))
    return found


@pytest.mark.parametrize("module", _modules())
def test_the_module_imports(module: str) -> None:
    importlib.import_module(module)
