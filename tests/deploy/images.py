"""Building idlegrid's images for tests, with Podman, into a podman state of their own that persists between runs.

The state lives in ``~/.cache/idlegrid/podman`` (``IDLEGRID_CACHE_DIR`` moves it), so the base image (a debootstrap
of Debian, about a minute the first time) and the image layers of idlegrid's dependencies are built once per
machine; the host's own podman storage is never read or changed. Settings as in tests/support/podman.py (runc, file
locks, vfs, low ulimits)."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.grid import REPO
from tests.support.podman import write_podman_config

AGENT_IMAGE = "localhost/idlegrid-agent:latest"
SERVER_IMAGE = "localhost/idlegrid-server:latest"
AGENT_UID = "10001"  # the images' user (deploy/*/Containerfile)
INSTALL = REPO / "deploy" / "agent" / "install.sh"
BUILD_TIMEOUT_S = 1500.0  # a bound for a hung build, not a figure: about 8 minutes from a fresh clone quiet, over 10 at load 10


def cache_dir() -> Path:
    return Path(os.environ.get("IDLEGRID_CACHE_DIR") or Path.home() / ".cache" / "idlegrid")


class ImageBuildFailed(AssertionError):
    """deploy/build-images failed; the message holds its output."""


@dataclass(frozen=True)
class ImagePodman:
    """The podman CLI on the images' persistent state."""

    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"`podman {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done


def image_podman() -> ImagePodman:
    state = cache_dir() / "podman"
    return ImagePodman({**os.environ, **write_podman_config(state), "IDLEGRID_CACHE_DIR": str(cache_dir())})


def build_images(podman: ImagePodman, *targets: str) -> float:
    """Run deploy/build-images for ``targets`` (what a person runs); the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [str(REPO / "deploy" / "build-images"), *targets],
        env=podman.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise ImageBuildFailed(f"deploy/build-images {' '.join(targets)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.monotonic() - started


def install(podman: ImagePodman, *args: str) -> subprocess.CompletedProcess[str]:
    """deploy/agent/install.sh with Podman and the image built here, as a provider runs it."""
    return subprocess.run(
        ["sh", str(INSTALL), "--engine", "podman", "--image", AGENT_IMAGE, *args],
        env=podman.env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def container_and_volume(podman: ImagePodman, prefix: str) -> Iterator[tuple[str, str]]:
    """A container name and a volume name of a test's own; whatever has them is removed afterwards."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    try:
        yield name, name
    finally:
        podman.run("rm", "--force", "--time", "5", name, check=False)
        podman.run("volume", "rm", "--force", name, check=False)
