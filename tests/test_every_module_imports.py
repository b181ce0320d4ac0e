"""Every module of the packages (and the benchmarks) imports. mypy runs with ``ignore_missing_imports`` for the
third-party libraries without stubs, which also hides an import of one of our own modules that moved away; this
catches it for modules no test imports (a benchmark, an entry point)."""

import importlib
import subprocess
import sys
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


def test_no_module_prints_a_warning_when_a_program_imports_it() -> None:
    """What a provider or renter would read on their terminal: a fresh interpreter with Python's default warning
    filters (no pytest capturing them) imports every module of the grid and prints nothing on stderr. asyncssh's DSA
    deprecation under cryptography 51 printed ten lines here (agent/ssh_library.py silences exactly that one)."""
    modules = [m for m in _modules() if not m.startswith("bench.")]
    program = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    ran = subprocess.run([sys.executable, "-c", program, *modules], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""
