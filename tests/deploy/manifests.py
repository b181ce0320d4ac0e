"""What the deployment files may name: the images deploy/ builds, and the public images compose.yaml may pull."""

from __future__ import annotations

from tests.support.grid import REPO

DEPLOY = REPO / "deploy"
# Each deploy/<name>/Containerfile is built by deploy/build-images as localhost/idlegrid-<name>.
BUILT_IMAGES = {f"localhost/idlegrid-{path.parent.name}" for path in DEPLOY.glob("*/Containerfile")}
# Official images of the projects themselves (Docker Hub): the store, the monitoring.
PUBLIC_IMAGES = {"mongo", "prom/prometheus", "grafana/grafana"}


def image_repository(reference: str) -> str:
    """``localhost/idlegrid-server:latest`` -> ``localhost/idlegrid-server``; ``mongo:7.0`` -> ``mongo``."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def is_known_image(reference: str) -> bool:
    return image_repository(reference) in BUILT_IMAGES | PUBLIC_IMAGES
