"""The images deploy/ builds, built once per test session (both image tests use both)."""

from __future__ import annotations

import pytest

from tests.deploy.images import ImagePodman, build_images, image_podman


@pytest.fixture(scope="session")
def engine() -> ImagePodman:
    """Podman on the images' persistent state, with localhost/idlegrid-agent and -server built from this checkout."""
    engine = image_podman()
    build_images(engine, "agent", "server")
    return engine
