"""The agent's package: one wheel of idlegrid, built once per Master process from the source it runs, then served.

A provider's host installs it with pip from ``/dist/<name>`` (deploy/agent/install.sh). The wheel is built by pip
(``pip wheel --no-deps --no-build-isolation``, setuptools' backend) from a copy of the source in a temporary directory,
so the checkout is never written to, and nothing is fetched: the builder is the Master's own setuptools and wheel.
An operator whose Master is not a checkout names a wheel instead (``agent_wheel``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from common.errors import IdlegridError

log = logging.getLogger(__name__)

PROJECT = "idlegrid"
# What the wheel is made of: the import packages and what setuptools reads beside them.
SOURCE_PACKAGES = ("agent", "access", "master", "management", "common")
SOURCE_FILES = ("pyproject.toml", "README.md")
BUILD_TIMEOUT_S = 300.0  # two slow cores take about 5 s; a stuck build must not hold installs forever
# The build's timestamps: the same source makes the same wheel, byte for byte.
SOURCE_DATE_EPOCH = "315532800"


class PackageUnavailable(IdlegridError):
    """The agent's package cannot be served: the message says what the operator can do."""


def source_root() -> Path:
    """The directory that holds this Master's import packages (a checkout has its pyproject.toml there)."""
    return Path(__file__).resolve().parents[2]


class AgentPackage:
    """The wheel at ``/dist/``: ``prebuilt`` as it is, or built from ``source`` into ``cache_dir`` at first ask."""

    def __init__(
        self, cache_dir: Path, *, source: Path | None = None, prebuilt: Path | None = None, python: str = sys.executable
    ) -> None:
        self.cache_dir = cache_dir
        self.source = source if source is not None else source_root()
        self.prebuilt = prebuilt
        self.python = python
        self._built: Path | None = None
        self._failed: PackageUnavailable | None = None  # a build that failed is not tried again by every request
        self._building = asyncio.Lock()

    @property
    def filename(self) -> str:
        """The wheel's file name, as pip needs it: ``idlegrid-<version>-py3-none-any.whl``."""
        if self.prebuilt is not None:
            return self.prebuilt.name
        return f"{PROJECT}-{self.version()}-py3-none-any.whl"

    def version(self) -> str:
        pyproject = self.source / "pyproject.toml"
        try:
            project = tomllib.loads(pyproject.read_text())["project"]
        except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
            raise PackageUnavailable(
                f"this Master does not run from a checkout ({pyproject} unreadable: {exc}); "
                "set agent_wheel to a wheel of idlegrid (deploy/build-images makes one) to serve it"
            ) from None
        if project.get("name") != PROJECT:
            raise PackageUnavailable(f"{pyproject} is not idlegrid's; set agent_wheel to a wheel of idlegrid to serve it")
        return str(project["version"])

    async def path(self) -> Path:
        """The wheel's file, built on the first call (later calls wait for that build, then reuse it)."""
        if self.prebuilt is not None:
            if not self.prebuilt.is_file():
                raise PackageUnavailable(f"agent_wheel names {self.prebuilt}, which is not a file")
            return self.prebuilt
        async with self._building:
            # Anyone may ask (no key): one build per Master process, and a failed one answers every later ask the
            # same, rather than costing the Master a build per request; a restart tries again.
            if self._failed is not None:
                raise self._failed
            if self._built is None or not self._built.is_file():
                try:
                    self._built = await asyncio.to_thread(self._build)
                except PackageUnavailable as exc:
                    self._failed = exc
                    raise
            return self._built

    def _build(self) -> Path:
        name = self.filename  # checks the source first
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="agent-wheel-") as scratch:
            tree = Path(scratch) / "src"
            tree.mkdir()
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules")
            for package in SOURCE_PACKAGES:
                shutil.copytree(self.source / package, tree / package, ignore=ignore)
            for file in SOURCE_FILES:
                if (self.source / file).exists():
                    shutil.copy2(self.source / file, tree / file)
            out = Path(scratch) / "out"
            command = [self.python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
            command += ["--disable-pip-version-check", "--wheel-dir", str(out), str(tree)]
            env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PIP_NO_INPUT": "1"}
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False)
            except subprocess.TimeoutExpired:
                raise PackageUnavailable(f"building the agent's package took over {BUILD_TIMEOUT_S:.0f} s") from None
            built = out / name
            if done.returncode != 0 or not built.is_file():
                log.error("building the agent's package failed", extra={"stderr": done.stderr[-2000:]})
                raise PackageUnavailable(
                    "building the agent's package failed (the Master needs setuptools and wheel): "
                    + (done.stderr.strip().splitlines() or ["no output"])[-1]
                )
            target = self.cache_dir / name
            shutil.copy2(built, target.with_suffix(".part"))
            os.replace(target.with_suffix(".part"), target)  # a reader never sees half a wheel
        log.info("built the agent's package", extra={"path": str(target)})
        return target
