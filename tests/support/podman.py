"""The real Podman Docker-compatible API for tests: a private service on a temp socket, with a local busybox image.

Everything Podman keeps (storage, run state, locks, events) lives in one temp directory, through a private
``containers.conf`` and ``storage.conf`` handed to podman by environment variables, so the host's own podman
state is never read or changed and ``stop()`` leaves nothing behind. Settings that matter on these machines:

- ``runtime = "runc"``: crun fails on this kernel's cgroups.
- ``default_ulimits``: the service's inherited limits are too high for runc to apply in a container.
- storage driver ``vfs``: no overlay mounts to leak, and it works where /tmp is itself an overlay (CI containers).
- ``lock_type = "file"``: the default shm locks live in /dev/shm shared with every other podman on the host,
  and a fresh podman state frees them all on its first start.
- ``cgroup_manager = "cgroupfs"``, ``events_logger = "file"``: no systemd or journald needed.

No registry is reachable, so the image is ``podman import`` of a rootfs made of ``/bin/busybox`` (busybox-static).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import pytest

BUSYBOX = Path("/bin/busybox")
IMAGE = "localhost/idlegrid-busybox:test"
# What a grid's operator and providers allow so renters may name IMAGE: its registry part, "localhost", is a name the
# egress rule refuses (common/egress.py) unless allowed by name. The image is built on the host and never pulled.
LOCAL_IMAGES_ALLOWED = ["localhost"]
API_VERSION = "v1.41"  # what Podman 4.3's compatible API reports; Docker 20.10+ speaks it too


class PodmanUnavailable(RuntimeError):
    """Podman cannot run here; the message says what to install or what failed."""


class PodmanService:
    """``podman system service`` on ``socket_path`` with ``image`` imported; ``stop()`` removes every trace."""

    def __init__(self, workdir: Path | None = None, *, image: str = IMAGE, start_timeout_s: float = 30.0) -> None:
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="idlegrid-podman-"))
        self.socket_path = self.workdir / "podman.sock"
        self.image = image
        self.start_timeout_s = start_timeout_s
        self._service: subprocess.Popen[bytes] | None = None
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(self.workdir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.workdir / "storage.conf"),
        }

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> PodmanService:
        if shutil.which("podman") is None:
            raise PodmanUnavailable("podman is not installed; the container runtime tests need it: apt-get install podman runc")
        if not BUSYBOX.exists():
            raise PodmanUnavailable(f"{BUSYBOX} is missing; the test image is built from it: apt-get install busybox-static")
        self._write_config()
        self.podman("info")  # fails early, with podman's own reason, if the engine cannot work on this host
        self._import_image()
        self._start_service()
        return self

    def stop(self) -> None:
        """Remove containers and images, stop the service, delete the state directory. Safe to call twice."""
        if (self.workdir / "containers.conf").exists():
            self.podman("rm", "--all", "--force", "--time", "0", check=False)
        self._stop_service()
        if (self.workdir / "containers.conf").exists():
            self.podman("rmi", "--all", "--force", check=False)
        _unmount_below(self.workdir)
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

    def podman(self, *args: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the podman CLI against this service's private state."""
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise PodmanUnavailable(f"`podman {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A raw Docker-API call, e.g. ``api("GET", "/containers/x/json")``; the version prefix is added."""
        connection = _UnixHTTPConnection(str(self.socket_path))
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

    # --- setting up ----------------------------------------------------------------------------------

    def _write_config(self) -> None:
        write_podman_config(self.workdir)

    def _import_image(self) -> None:
        rootfs = self.workdir / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        for mountpoint in ("proc", "sys", "dev", "etc", "tmp"):
            (rootfs / mountpoint).mkdir()
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        archive = self.workdir / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        self.podman(
            "import",
            "--quiet",
            "--change",
            "ENV PATH=/bin",
            "--change",
            'CMD ["sleep", "3600"]',
            str(archive),
            self.image,
        )
        archive.unlink()
        shutil.rmtree(rootfs)

    def _start_service(self) -> None:
        log = open(self.workdir / "service.log", "wb")
        with log:
            self._service = subprocess.Popen(
                ["podman", "system", "service", "--time=0", self.url],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._service.poll() is not None:
                raise PodmanUnavailable(f"podman system service exited at once: {self._log_tail()}")
            if self._ping():
                return
            time.sleep(0.05)
        raise PodmanUnavailable(
            f"podman system service did not answer /_ping within {self.start_timeout_s:.0f} s: {self._log_tail()}"
        )

    def _ping(self) -> bool:
        connection = _UnixHTTPConnection(str(self.socket_path), timeout=2)
        try:
            connection.request("GET", "/_ping")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def _stop_service(self) -> None:
        if self._service is None or self._service.poll() is not None:
            return
        os.killpg(self._service.pid, signal.SIGTERM)  # the service and anything it started in its session
        try:
            self._service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._service.pid, signal.SIGKILL)
            self._service.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            return (self.workdir / "service.log").read_text()[-2000:].strip() or "(no output)"
        except OSError:
            return "(no log)"


def write_podman_config(workdir: Path) -> dict[str, str]:
    """Podman's settings for a state kept entirely under ``workdir`` (the module's docstring says why each), and the
    environment that points podman at them: every podman run with it sees that state and nothing of the host's."""
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    (workdir / "containers.conf").write_text(
        "[engine]\n"
        'runtime = "runc"\n'
        'lock_type = "file"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{workdir / "tmp"}"\n'
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    )
    (workdir / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{workdir / "storage"}"\nrunroot = "{workdir / "run"}"\n'
    )
    return {"CONTAINERS_CONF": str(workdir / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(workdir / "storage.conf")}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _unmount_below(directory: Path) -> None:
    """Lazily unmount whatever a crashed container left mounted under ``directory`` (e.g. its /dev/shm)."""
    prefix = str(directory.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        targets = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for target in sorted(targets, reverse=True):  # deepest first
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


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
