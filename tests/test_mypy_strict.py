"""Issue 38, point 6: mypy's ``--strict`` checks on the grid's core (``common``, ``master`` and management's
``workloads``, ``scheduler``, ``market``, and ``endpoints`` since), and mypy over ``tests/``. ``--strict`` itself
cannot be set per module, so pyproject.toml sets each of its per-module checks for those packages; this test keeps
every one of them there (scripts/test runs mypy with that configuration)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
STRICT_CORE = {"common.*", "master.*", "management.workloads.*", "management.scheduler.*", "management.market.*"}
# What ``mypy --strict`` turns on, as mypy's documentation lists it: per module ...
STRICT_PER_MODULE = {
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "disallow_untyped_calls",
    "disallow_untyped_decorators",
    "disallow_any_generics",
    "disallow_subclassing_any",
    "warn_return_any",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}
# ... and for the whole run (on in every module checked).
STRICT_GLOBAL = {"check_untyped_defs", "warn_unused_ignores", "warn_redundant_casts"}


def mypy_config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"]
    return config


def strict_modules(config: dict[str, object]) -> set[str]:
    """The modules an override gives every per-module check of ``--strict``."""
    overrides = config.get("overrides", [])
    assert isinstance(overrides, list)
    found: set[str] = set()
    for override in overrides:
        if all(override.get(flag) is True for flag in STRICT_PER_MODULE):
            modules = override["module"]
            found |= {modules} if isinstance(modules, str) else set(modules)
    return found


def test_the_core_has_every_check_of_strict() -> None:
    config = mypy_config()
    missing = STRICT_CORE - strict_modules(config)
    assert missing == set(), f"pyproject.toml's strict override lacks {sorted(missing)}"
    assert {flag for flag in STRICT_GLOBAL if config.get(flag) is not True} == set()


def test_mypy_checks_every_package_and_the_tests() -> None:
    files = mypy_config()["files"]
    assert isinstance(files, list)
    assert {"common", "agent", "access", "master", "management", "bench", "tests"} <= set(files)


def test_an_override_missing_one_check_does_not_count() -> None:
    lax = {flag: True for flag in STRICT_PER_MODULE} | {"module": ["master.*"], "warn_return_any": False}
    assert strict_modules({"overrides": [lax]}) == set()
    assert strict_modules({"overrides": [lax | {"warn_return_any": True}]}) == {"master.*"}
