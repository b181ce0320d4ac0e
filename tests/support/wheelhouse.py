"""Wheels of what this Python already has installed: idlegrid's dependencies, for a pip with no index.

No package index is reachable in tests, and pip cannot make a wheel of an installed distribution, so each one is
packed again from its installed files (its RECORD lists them) with its own dist-info, whose WHEEL file keeps the
platform tags it was built for. Enough for ``pip install --no-index --find-links`` into a fresh environment of the
same Python on the same machine: what a provider with an offline wheel mirror does.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT_PROJECT = "idlegrid"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(project: str = ROOT_PROJECT) -> list[metadata.Distribution]:
    """The installed distributions ``project`` needs (no extras), and theirs, for this Python and platform."""
    seen: dict[str, metadata.Distribution] = {}
    pending = [Requirement(r) for r in metadata.requires(project) or []]
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = _normal(requirement.name)
        if key in seen:
            continue
        dist = metadata.distribution(requirement.name)
        seen[key] = dist
        pending += [Requirement(r) for r in dist.requires or []]
    return list(seen.values())


def repack(dist: metadata.Distribution, into: Path) -> Path:
    """One installed distribution as a wheel in ``into``."""
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip().split("-") for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    # Several tags (py2-none-any, py3-none-any) fold into one compressed tag set (py2.py3-none-any), as pip names them.
    folded = "-".join(".".join(dict.fromkeys(part[i] for part in tags)) for i in range(3)) if tags else "py3-none-any"
    name = re.sub(r"[-.]+", "_", dist.metadata["Name"])
    target = into / f"{name}-{dist.version}-{folded}.whl"
    if target.exists():
        return target
    base = Path(str(dist.locate_file("")))
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in dist.files or []:
            # Skip what lies outside site-packages (console scripts: pip writes them again) and compiled caches.
            if file.parts[0] == ".." or "__pycache__" in file.parts or file.name == "INSTALLER":
                continue
            source = base / file
            if source.is_file():
                archive.write(source, file.as_posix())
    return target


def build_wheelhouse(into: Path, project: str = ROOT_PROJECT) -> Path:
    """``into`` filled with a wheel of each of ``project``'s installed dependencies."""
    into.mkdir(parents=True, exist_ok=True)
    for dist in dependency_closure(project):
        repack(dist, into)
    return into
