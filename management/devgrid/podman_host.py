"""A container host for a local grid: a private Podman service (Docker-compatible API) and images built on this machine.

The demo's container host, the tests' Podman service (tests/support/podman.py) and a person adding a container host
to a local grid by hand (docs/localgrid.md) all set Podman up this way. Everything Podman keeps (storage, run state,
locks, events) lives under one directory, through a private ``containers.conf`` and ``storage.conf`` handed to podman
by environment variables, so the host's own podman state is never read or changed. Settings that matter on these
machines:

- ``runtime = "runc"``: crun fails on this kernel's cgroups.
- ``default_ulimits``: the service's inherited limits are too high for runc to apply in a container.
- storage driver ``vfs``: no overlay mounts to leak, and it works where /tmp is itself an overlay (CI containers).
- ``lock_type = "file"``: the default shm locks live in /dev/shm shared with every other podman on the host,
  and a fresh podman state frees them all on its first start.
- ``cgroup_manager = "cgroupfs"``, ``events_logger = "file"``: no systemd or journald needed.
- ``netns = "slirp4netns"`` (optional, the demo's; the agent asks it of each container too: its ``docker_network``):
  containers' networks without CNI's bridge, whose network namespace files live in /run/netns, where a mount
  namespace made at that moment (a process-runtime host's sandbox, ``unshare --mount``) now and then hides a new one
  from the CNI plugin ("unknown FS magic on /run/netns/..."), failing the container's start. A renter's port is
  reached through the engine either way (the agent's port bridge).

No registry needs to be reachable: images are ``podman import`` of a rootfs made of ``/bin/busybox`` (busybox-static),
built once and kept in the directory's storage (``ensure_image`` builds only what is missing). ``stop_service`` stops
the service and removes the containers, and keeps the storage, so the next start reuses the images.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import IdlegridError

BUSYBOX = Path("/bin/busybox")
REQUIRED = (("podman", "podman"), ("runc", "runc"))  # (program, Debian package)
INSTALL_PACKAGES = ("podman", "runc", "busybox-static")
# Images the local grid builds (their registry part, "localhost", is a name the egress rule refuses unless the Master's
# and the agent's egress_allow name it: common/egress.py).
SELFTEST_IMAGE = "localhost/idlegrid-selftest:1"  # the GPU self-test's probe runs in it (agent/runtime/selftest.py)
DEMO_IMAGE = "localhost/idlegrid-demo:1"  # busybox with a web page: httpd on DEMO_PORT
DEMO_PORT = 8080
DEMO_PAGE = "<!DOCTYPE html>\n<title>idlegrid demo</title>\n<h1>Hello from the demo's container host</h1>\n"
SOCKET_NAME = "podman.sock"
RM_TIMEOUT_S = 20.0  # how long stopping waits for ``podman rm --all`` before it stops the service anyway
MAX_SOCKET_PATH = 100  # a unix socket's path must fit sun_path (108 bytes on Linux)
# Mount points a container's runtime needs in the image, and /www for the demo's page.
ROOT_DIRS = ("proc", "sys", "dev", "etc", "tmp")
HOST_PYTHON = "3.11"  # Debian 12's python3, which an image with Python carries (add_python)
# What of the host's standard library an image leaves out: tests, tools, caches, Tk (about 25 of its 54 MB).
STDLIB_LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "__pycache__", "config-3*", "*_test*.so")
# What glibc loads at run time, which ``ldd`` cannot see: libgcc_s unwinds a thread that pthread_exit ends, as Python
# ends a daemon thread still running when the interpreter exits. Without it such an exit aborts (status 139, "libgcc_s.so.1
# must be installed for pthread_exit to work"): an endpoint worker stopped while a thread still waits on its socket.
DLOPENED = ("libgcc_s.so.1",)
# Bumped when what ``add_python`` puts in an image changes, so a kept image of the old layout is built again.
PYTHON_LAYOUT = "2"


class PodmanUnavailable(IdlegridError):
    """Podman cannot run here; the message says what is missing or what failed, and what to install."""

    code = "podman_unavailable"


@dataclass(frozen=True)
class BusyboxImage:
    """An image of busybox-static and its applets: ``files`` (path in the image -> text) and Containerfile-style
    ``changes`` (``ENV``, ``CMD``, ``EXPOSE``) on top; with ``python``, the host's Python 3 too (``add_python``)."""

    reference: str
    changes: Sequence[str]
    files: Mapping[str, str] = field(default_factory=dict)
    python: bool = False


SELFTEST = BusyboxImage(SELFTEST_IMAGE, ("ENV PATH=/bin", 'CMD ["sleep", "3600"]'))


def _worker_files() -> dict[str, str]:
    """The handler library as the package ``idlegrid_worker`` (its imports are relative) and the echo worker."""
    library = Path(__file__).resolve().parents[2] / "common" / "endpoint_worker"
    files = {f"opt/idlegrid_worker/{source.name}": source.read_text() for source in sorted(library.glob("*.py"))}
    files["app/worker.py"] = (Path(__file__).parent / "echo_worker.py").read_text()
    return files


WORKER_FILES = _worker_files()
# An endpoint's worker: the host's Python and the handler library, serving the echo worker. Its tag is its files'
# digest, so a state directory that kept an image of another version of the library builds this one beside it.
WORKER_IMAGE = (
    "localhost/idlegrid-worker:" + hashlib.sha256(repr((PYTHON_LAYOUT, sorted(WORKER_FILES.items()))).encode()).hexdigest()[:12]
)
WORKER = BusyboxImage(
    WORKER_IMAGE,
    ("ENV PATH=/usr/bin:/bin", "ENV PYTHONPATH=/opt", "ENV PYTHONDONTWRITEBYTECODE=1", 'CMD ["python3", "/app/worker.py"]'),
    WORKER_FILES,
    python=True,
)
DEMO = BusyboxImage(
    DEMO_IMAGE,
    ("ENV PATH=/bin", f"EXPOSE {DEMO_PORT}", f'CMD ["httpd", "-f", "-v", "-p", "{DEMO_PORT}", "-h", "/www"]'),
    {"www/index.html": DEMO_PAGE},
)


def write_podman_config(workdir: Path, *, netns: str = "") -> dict[str, str]:
    """Podman's settings for a state kept entirely under ``workdir`` (the module's docstring says why each), and the
    environment that points podman at them: every podman run with it sees that state and nothing of the host's.
    ``netns``: the containers' network mode ("slirp4netns"); "" is podman's default (CNI's bridge)."""
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    (workdir / "containers.conf").write_text(
        "[engine]\n"
        'runtime = "runc"\n'
        'lock_type = "file"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{workdir / "tmp"}"\n'
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n' + (f'netns = "{netns}"\n' if netns else "")
    )
    (workdir / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{workdir / "storage"}"\nrunroot = "{workdir / "run"}"\n'
    )
    return {"CONTAINERS_CONF": str(workdir / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(workdir / "storage.conf")}


def missing_programs(extra: Sequence[str] = ()) -> str | None:
    """What this machine lacks to run a Podman host (and the programs ``extra``, each its Debian package's name), and
    what to install, or None."""
    wanted = [*REQUIRED, *((program, program) for program in extra)]
    missing = [package for program, package in wanted if shutil.which(program) is None]
    if not BUSYBOX.exists():
        missing.append("busybox-static")
    if not missing:
        return None
    hint = " ".join(["apt-get install", *dict.fromkeys([*INSTALL_PACKAGES, *extra])])
    return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed ({hint})"


def socket_path_for(workdir: Path) -> Path:
    """Where the service listens: in ``workdir``, or, when that path would not fit a unix socket's address, in a
    directory of the temp dir named after ``workdir`` (the same one each time)."""
    inside = workdir.resolve() / SOCKET_NAME
    if len(str(inside)) <= MAX_SOCKET_PATH:
        return inside
    digest = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"idlegrid-podman-{digest}" / SOCKET_NAME


class PodmanHost:
    """Podman's state under ``workdir``: the CLI on it (``podman``), images built there (``ensure_image``) and
    ``podman system service`` on ``socket_path`` (``start_service``, ``stop_service``)."""

    def __init__(self, workdir: Path, *, netns: str = "", start_timeout_s: float = 30.0) -> None:
        self.workdir = Path(workdir)
        self.netns = netns  # the containers' network mode (write_podman_config); "" is podman's default
        self.socket_path = socket_path_for(self.workdir)
        self.start_timeout_s = start_timeout_s
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(self.workdir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.workdir / "storage.conf"),
        }
        self._service: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "service.log"

    def configure(self) -> None:
        """Write the private configuration and check that podman works with it (PodmanUnavailable with its reason)."""
        missing = missing_programs([self.netns] if self.netns else [])
        if missing is not None:
            raise PodmanUnavailable(missing)
        write_podman_config(self.workdir, netns=self.netns)
        self.podman("info")  # fails early, with podman's own reason, if the engine cannot work on this host

    def podman(self, *args: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the podman CLI against this state."""
        try:
            done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise PodmanUnavailable(f"`podman {' '.join(args)}` did not finish within {timeout_s:g} s") from None
        if check and done.returncode != 0:
            raise PodmanUnavailable(f"`podman {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip() or 'no output'}")
        return done

    def image_id(self, reference: str) -> str | None:
        """The id of the image ``reference`` in this state, or None when it has none."""
        done = self.podman("image", "inspect", "--format", "{{.Id}}", reference, check=False)
        if done.returncode != 0:
            return None
        return done.stdout.strip() or None

    def ensure_image(self, image: BusyboxImage) -> bool:
        """Build ``image`` unless this state has it already; whether it was built now."""
        if self.image_id(image.reference) is not None:
            return False
        self.build_image(image)
        return True

    def build_image(self, image: BusyboxImage) -> None:
        """``podman import`` of a busybox rootfs with ``image``'s files and changes (replacing a tag of that name)."""
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=self.workdir) as scratch:
            archive = busybox_rootfs_archive(Path(scratch), image.files, python=image.python)
            changes = [arg for change in image.changes for arg in ("--change", change)]
            self.podman("import", "--quiet", *changes, str(archive), image.reference)

    def start_service(self) -> None:
        """``podman system service`` on ``socket_path``, waited for until it answers ``/_ping``."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # left by a service that was killed
        # stdin is the launcher's, as the tests' service always had it: with /dev/null, containers' CNI network
        # namespaces failed now and then on these machines ("unknown FS magic on /run/netns/..."), for no reason found.
        with open(self.log_file, "ab") as log:
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
                raise PodmanUnavailable(f"podman system service exited at once: {self.log_tail()}")
            if ping(self.socket_path):
                return
            time.sleep(0.05)
        raise PodmanUnavailable(
            f"podman system service did not answer /_ping within {self.start_timeout_s:.0f} s: {self.log_tail()}"
        )

    def stop_service(self) -> None:
        """Remove every container, then stop the service, whether or not the removal worked; the storage (and its
        images) is kept. Safe to call twice."""
        try:
            if (self.workdir / "containers.conf").exists():
                # Bounded well within the minute a caller gives a stop (a hung removal was seen in CI twice): killing
                # the service's session, next, ends what it left.
                self.podman("rm", "--all", "--force", "--time", "0", check=False, timeout_s=RM_TIMEOUT_S)
        except PodmanUnavailable as exc:  # a hung removal (seen once in CI): the service and the sweep still end them
            print(f"idlegrid demo: {exc}; stopping Podman anyway", file=sys.stderr)
        finally:
            self._stop_process()
            # A container's /dev/shm that its removal left mounted (seen after a demo's stop): the directory could not
            # be deleted, and a later start would find it busy.
            unmount_below(self.workdir)

    def _stop_process(self) -> None:
        service, self._service = self._service, None
        if service is None or service.poll() is not None:
            return
        os.killpg(service.pid, signal.SIGTERM)  # the service and anything it started in its session
        try:
            service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait(timeout=10)

    def log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-2000:].strip() or "(no output)"
        except OSError:
            return "(no log)"


def busybox_rootfs_archive(scratch: Path, files: Mapping[str, str] | None = None, *, python: bool = False) -> Path:
    """A tar of a root filesystem with ``/bin/busybox`` (busybox-static), a link per applet, the mount points a
    container needs and ``files`` (and the host's Python 3, ``add_python``), made in ``scratch``."""
    rootfs = scratch / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    for mountpoint in ROOT_DIRS:
        (rootfs / mountpoint).mkdir()
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (rootfs / "bin" / applet).symlink_to("busybox")
    if python:
        add_python(rootfs)
    for path, text in (files or {}).items():
        target = rootfs / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    archive = scratch / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
    shutil.rmtree(rootfs)
    return archive


def unmount_below(directory: Path) -> None:
    """Lazily unmount whatever is still mounted under ``directory`` (a container's /dev/shm), deepest first."""
    prefix = str(directory.resolve()) + "/"
    try:
        with open("/proc/self/mounts") as mounts:
            targets = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    except OSError:
        return
    for target in sorted(targets, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def add_python(rootfs: Path) -> None:
    """The host's Python 3 interpreter (Debian's ``python3``: /usr/bin/python3.X), its standard library without its
    tests and tools, and every shared library the two link (as ``ldd`` resolves them), copied into ``rootfs``: enough
    for a stdlib-only program, such as an endpoint worker on the handler library, in an image built offline.
    PodmanUnavailable when the host has no such Python."""
    interpreter = Path(f"/usr/bin/python{HOST_PYTHON}")
    stdlib = Path(f"/usr/lib/python{HOST_PYTHON}")
    if not interpreter.exists() or not stdlib.is_dir():
        raise PodmanUnavailable(f"an image with Python needs the host's {interpreter} (Debian package python3)")
    (rootfs / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(interpreter, rootfs / "usr" / "bin" / interpreter.name)
    (rootfs / "usr" / "bin" / "python3").symlink_to(interpreter.name)
    shutil.copytree(stdlib, rootfs / stdlib.relative_to("/"), symlinks=True, ignore=shutil.ignore_patterns(*STDLIB_LEFT_OUT))
    linked = [interpreter, *sorted((stdlib / "lib-dynload").glob("*.so"))]
    loaded = [_library_path(name) for name in DLOPENED]
    linked += loaded
    for library in sorted({*loaded, *(lib for program in linked for lib in _linked_libraries(program))}):
        target = rootfs / library.relative_to("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(library, target)  # a link's target's bytes, under the name the loader asks for


def _library_path(name: str) -> Path:
    """Where the loader finds the shared library ``name`` (as ``ldconfig -p`` lists it); PodmanUnavailable if nowhere."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"  # in /sbin, which a user's PATH may lack
    listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        soname, _, path = line.strip().partition(" => ")
        if soname.split(" ")[0] == name and Path(path).exists():
            return Path(path)
    raise PodmanUnavailable(f"an image with Python needs the host's {name} (Debian package libgcc-s1)")


def _linked_libraries(program: Path) -> list[Path]:
    """The shared libraries ``program`` loads, by the paths ``ldd`` resolves (the loader itself included)."""
    listed = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=False).stdout
    found = []
    for line in listed.splitlines():
        words = line.replace("=>", " ").split()
        found += [Path(word) for word in words if word.startswith("/")]
    return found


def ping(socket_path: Path) -> bool:
    """Whether an engine answers ``/_ping`` on ``socket_path``."""
    connection = UnixHTTPConnection(str(socket_path), timeout=2)
    try:
        connection.request("GET", "/_ping")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the engine's API."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock
