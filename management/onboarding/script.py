"""The installer as a Master serves it, and the one-line commands that fetch and run it.

deploy/agent/install.sh carries three empty assignments (``served_grid=""``, ``served_access=""``,
``served_wheel=""``); the Master fills them in with the URL the provider reached it at, a relay's enrollment URL
and the agent's package name, so the join token is all the command needs. Pure: text in, text out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from management.onboarding.package import PackageUnavailable, source_root

SERVED_FIELDS = ("served_grid", "served_access", "served_wheel")
# Where ready commands say to install: what install.sh picks for each engine (docs/install-provider.md).
ENGINES = (
    ("docker", "Docker", "The agent runs renters' containers through Docker (GPUs by the NVIDIA Container Toolkit)"),
    ("podman", "Podman", "The agent runs renters' containers through Podman's Docker API (GPUs as CDI devices)"),
    ("none", "No container engine", "The agent runs renters' commands as sandboxed host processes (the process runtime)"),
)


@dataclass(frozen=True, slots=True)
class InstallCommand:
    engine: str  # docker | podman | none: install.sh's --engine
    label: str
    what: str  # one line: what the host then runs renters' work with
    command: str


def installer_template(source: Path | None = None) -> str:
    path = (source or source_root()) / "deploy" / "agent" / "install.sh"
    try:
        return path.read_text()
    except OSError as exc:
        raise PackageUnavailable(f"this Master has no installer to serve ({path}: {exc.strerror})") from None


def served_script(template: str, *, grid_url: str, access_url: str, wheel: str) -> str:
    """``template`` with the grid's URL, the relay's enrollment URL and the package's name filled in."""
    values = {"served_grid": grid_url.rstrip("/"), "served_access": access_url, "served_wheel": wheel}
    lines = template.splitlines(keepends=True)
    filled = set()
    for number, line in enumerate(lines):
        name = line.partition("=")[0]
        if name in values and line.rstrip("\n") == f'{name}=""':
            lines[number] = f"{name}={shlex.quote(values[name])}\n"
            filled.add(name)
    missing = set(SERVED_FIELDS) - filled
    if missing:  # an installer edited without its blanks: serving it unfilled would break every host's install
        raise PackageUnavailable(f"the installer has no blank {', '.join(sorted(missing))} line to fill in")
    return "".join(lines)


def install_commands(grid_url: str, token: str) -> list[InstallCommand]:
    """The one-line command for each engine, with ``token`` (one-time) in it."""
    fetch = f"curl -fsSL {shlex.quote(grid_url.rstrip('/') + '/install.sh')} | sudo sh -s -- --token {shlex.quote(token)}"
    return [InstallCommand(engine, label, what, f"{fetch} --engine {engine}") for engine, label, what in ENGINES]
