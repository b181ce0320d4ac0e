"""The real Podman Docker-compatible API for tests: a private service on a temp socket, with a local busybox image.

The configuration, the image build and the service are the local grid's own (management/devgrid/podman_host.py, whose
docstring says why each setting): everything Podman keeps lives in one temp directory, so the host's own podman state
is never read or changed, and, unlike the demo's container host, ``stop()`` leaves nothing behind.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import pytest

from management.devgrid.podman_host import (
    BUSYBOX,
    BusyboxImage,
    PodmanHost,
    PodmanUnavailable,
    UnixHTTPConnection,
    write_podman_config,
)

__all__ = ["BUSYBOX", "IMAGE", "LOCAL_IMAGES_ALLOWED", "PodmanService", "PodmanUnavailable", "podman", "write_podman_config"]

IMAGE = "localhost/idlegrid-busybox:test"
# What a grid's operator and providers allow so renters may name IMAGE: its registry part, "localhost", is a name the
# egress rule refuses (common/egress.py) unless allowed by name. The image is built on the host and never pulled.
LOCAL_IMAGES_ALLOWED = ["localhost"]
API_VERSION = "v1.41"  # what Podman 4.3's compatible API reports; Docker 20.10+ speaks it too


class PodmanService(PodmanHost):
    """``podman system service`` on ``socket_path`` with ``image`` imported; ``stop()`` removes every trace."""

    def __init__(self, workdir: Path | None = None, *, image: str = IMAGE, start_timeout_s: float = 30.0) -> None:
        workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="idlegrid-podman-"))
        super().__init__(workdir, start_timeout_s=start_timeout_s)
        self.image = image

    def start(self) -> PodmanService:
        self.configure()
        self.build_image(BusyboxImage(self.image, ("ENV PATH=/bin", 'CMD ["sleep", "3600"]')))
        self.start_service()
        return self

    def stop(self) -> None:
        """Remove containers and images, stop the service, delete the state directory. Safe to call twice."""
        self.stop_service()
        if (self.workdir / "containers.conf").exists():
            self.podman("rmi", "--all", "--force", check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PodmanService:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # --- for assertions ----------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A raw Docker-API call, e.g. ``api("GET", "/containers/x/json")``; the version prefix is added."""
        connection = UnixHTTPConnection(str(self.socket_path))
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, f"/{API_VERSION}{path}", body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            connection.close()

    def inspect(self, name: str) -> dict[str, Any] | None:
        status, body = self.api("GET", f"/containers/{quote(name, safe='')}/json")
        if status == 404:
            return None
        assert status == 200, body
        return body


@pytest.fixture(scope="session")
def podman() -> Iterator[PodmanService]:
    """One Podman service for the session; it fails (never skips) where podman cannot run, since CI installs it."""
    service = PodmanService()
    try:
        service.start()
    except PodmanUnavailable as exc:
        service.stop()
        pytest.fail(f"the Podman service for the container tests could not start: {exc}", pytrace=False)
    try:
        yield service
    finally:
        service.stop()
