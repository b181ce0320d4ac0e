"""constraints.txt pins every version a fresh machine installs (scripts/setup-env, deploy/build-images), so a release
nobody chose cannot change what the suite runs on; scripts/lock refreshes it on purpose."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def test_every_declared_dependency_is_pinned_within_what_pyproject_allows() -> None:
    pins = _pins()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is in pyproject.toml but not pinned: run scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement.name}=={pins[name]} (constraints.txt) is outside {requirement.specifier} (pyproject.toml)"
        )


def test_what_this_environment_installed_is_exactly_what_is_pinned() -> None:
    """Every distribution installed for idlegrid and its test extras, down to the last transitive dependency, is
    pinned and installed at its pin: setup-env really installs from the lock."""
    pins = _pins()
    wanted = [r for r in _declared() if r.marker is None or r.marker.evaluate({"extra": "test"})]
    seen: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # an extra this environment does not install (bench, gpu): pinned all the same, checked above
        assert name in pins, f"{requirement.name} {distribution.version} is installed but not pinned: run scripts/lock"
        assert distribution.version == pins[name], f"{requirement.name} {distribution.version} installed, {pins[name]} pinned"
        extras = set(requirement.extras)
        for line in distribution.requires or []:
            dependency = Requirement(line)
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras | {""}):
                wanted.append(dependency)
    assert "cryptography" in seen and "asyncssh" in seen
