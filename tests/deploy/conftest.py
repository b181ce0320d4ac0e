"""The images deploy/ builds, built once per test session (both image tests use both).

Under pytest-xdist (scripts/test) each worker has a session of its own, and two builds at once in one podman state
trip over each other's layers: the first worker to take the lock builds, the others find the stamp of this run
(``PYTEST_XDIST_TESTRUNUID``, one per run, the same in every worker) and use what it built."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

import pytest

from tests.deploy.images import ImagePodman, build_images, cache_dir, image_podman


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture(scope="session")
def engine() -> ImagePodman:
    """Podman on the images' persistent state, with localhost/idlegrid-agent and -server built from this checkout."""
    engine = image_podman()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    with build_lock():
        stamp = cache_dir() / f"built-for-{run}" if run else None
        if stamp is None or not stamp.exists():
            for old in cache_dir().glob("built-for-*"):
                old.unlink()
            build_images(engine, "agent", "server")
            if stamp is not None:
                stamp.touch()
    return engine
