"""A real image registry for tests: Debian's ``docker-registry`` (the CNCF distribution registry, 2.8) on 127.0.0.1.

Plain HTTP on a free port with a filesystem store in a temp directory; ``private=True`` puts every repository behind
htpasswd (bcrypt) basic auth for two users (``USER``, ``OTHER_USER``). The distribution registry has no per-repository
auth, so a test that wants one public and one private repository runs two registries. Engines must be told the registry
is insecure (plain HTTP): ``podman push --tls-verify=false``, and a ``registries.conf`` (``insecure_registries_conf``)
for a pulling engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from common.egress import EgressRule
from tests.support.podman import BUSYBOX, PodmanService, PodmanUnavailable
from tests.support.processes import stop_process

USER, PASSWORD = "renter", "s3cret-registry-pass"
OTHER_USER, OTHER_PASSWORD = "teammate", "another-registry-pass"  # a second account with the same rights
MB = 1_000_000
BIG_FILLER_BYTES = 8 * MB  # the large image's extra layer content: past the 5 MB limit tests set


class RegistryUnavailable(RuntimeError):
    """The registry cannot run here; the message says what to install or what failed."""


class Registry:
    """``docker-registry serve`` on 127.0.0.1:``port``; ``stop()`` removes its store."""

    def __init__(self, *, private: bool = False, start_timeout_s: float = 20.0) -> None:
        self.private = private
        self.workdir = Path(tempfile.mkdtemp(prefix="idlegrid-registry-"))
        self.port = _free_port()
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """How image references name it: ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RegistryUnavailable("docker-registry is not installed: apt-get install docker-registry")
        config = self.workdir / "config.yml"
        auth = ""
        if self.private:
            import bcrypt  # a test dependency (pyproject [test]); the registry reads only bcrypt htpasswd entries

            entries = "".join(
                f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"  # 4: cheap, a test
                for user, password in ((USER, PASSWORD), (OTHER_USER, OTHER_PASSWORD))
            )
            (self.workdir / "htpasswd").write_text(entries)
            auth = f"auth:\n  htpasswd:\n    realm: idlegrid-test\n    path: {self.workdir / 'htpasswd'}\n"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.workdir / 'store'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n" + auth
        )
        log = open(self.workdir / "registry.log", "wb")
        with log:
            self._process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RegistryUnavailable(f"docker-registry exited at once: {self._log_tail()}")
            if self._answers():
                return self
            time.sleep(0.05)
        raise RegistryUnavailable(f"docker-registry did not answer within {self.start_timeout_s:.0f} s: {self._log_tail()}")

    def stop(self) -> None:
        stop_process(self._process, timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Registry:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # a private registry answers, asking for credentials
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return (self.workdir / "registry.log").read_text()[-2000:].strip() or "(no output)"
        except OSError:
            return "(no log)"


def insecure_registries_conf(path: Path, hosts: Sequence[str]) -> Path:
    """A ``registries.conf`` marking ``hosts`` (HOST:PORT) as plain HTTP, for an engine's ``CONTAINERS_REGISTRIES_CONF``."""
    path.write_text("".join(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n\n' for host in hosts))
    return path


class ThrottledProxy:
    """A TCP proxy on 127.0.0.1:``port`` to ``target`` that sends the answers at ``rate`` bytes a second: a registry
    as slow as one across the internet, so an engine reports a pull's bytes while it goes (Podman does once a second).
    Runs in the test's event loop: ``async with ThrottledProxy(...)``."""

    CHUNK = 64 * 1024

    def __init__(self, port: int, target: Registry, rate: float) -> None:
        self.port, self.target, self.rate = port, target, rate
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.sent = 0  # bytes carried from the registry to the engine

    async def __aenter__(self) -> ThrottledProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[ThrottledProxy]:
        """For a test without an event loop: the proxy served by a loop on a thread of its own."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="throttled-proxy", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.__aenter__(), loop).result(timeout=10)
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self.__aexit__(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target.port)
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, 0)),
            asyncio.ensure_future(self._pipe(up_reader, writer, self.rate)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for w in (writer, up_writer):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float) -> None:
        while chunk := await reader.read(self.CHUNK):
            writer.write(chunk)
            await writer.drain()
            if rate:
                self.sent += len(chunk)
                await asyncio.sleep(len(chunk) / rate)
        if writer.can_write_eof():
            writer.write_eof()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Images:
    """What the registries hold (references) and the registries themselves."""

    def __init__(self, public: Registry, private: Registry) -> None:
        self.public, self.private = public, private
        self.small = [f"{public.host}/tools/busy:{n}" for n in (1, 2, 3)]  # three images of one busybox layer
        self.big = f"{public.host}/tools/big:1"
        self.secret = f"{private.host}/team/secret:1"
        self.slow_port = _free_port()  # where a test may run a ThrottledProxy to the public registry

    @property
    def allowed(self) -> list[str]:
        """The ``egress_allow`` entries that let hosts pull from these registries (127.0.0.1, a private address)."""
        return [self.public.host, self.private.host, f"127.0.0.1:{self.slow_port}"]

    @property
    def provider_allows(self) -> EgressRule:
        """A host's egress rule whose provider allows these registries by name."""
        return EgressRule.allowing(self.allowed)

    @property
    def slow_big(self) -> str:
        """The large image, through the throttled proxy (``ThrottledProxy(images.slow_port, images.public, rate)``)."""
        return self.big.replace(self.public.host, f"127.0.0.1:{self.slow_port}")


def _rootfs_archive(workdir: Path, filler_bytes: int = 0) -> Path:
    """A busybox-static rootfs as a tar (what tests/support/podman imports), optionally with a random filler file."""
    rootfs = workdir / f"rootfs-{filler_bytes}"
    (rootfs / "bin").mkdir(parents=True)
    for mountpoint in ("proc", "sys", "dev", "etc", "tmp"):
        (rootfs / mountpoint).mkdir()
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep", "echo", "cat", "true"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    if filler_bytes:
        (rootfs / "filler").write_bytes(os.urandom(filler_bytes))  # random: no compression makes it small again
    archive = workdir / f"rootfs-{filler_bytes}.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
    shutil.rmtree(rootfs)
    return archive


@contextlib.contextmanager
def filled_registries(builder: PodmanService, work: Path) -> Iterator[Images]:
    """Both registries, filled by ``builder`` (a Podman state that keeps none of what it pushed); stopped afterwards."""
    public, private = Registry(), Registry(private=True)
    try:
        public.start()
        private.start()
    except RegistryUnavailable as exc:
        public.stop()
        private.stop()
        pytest.fail(f"the image registry for the pull tests could not start: {exc}", pytrace=False)
    made = Images(public, private)
    small, big = _rootfs_archive(work), _rootfs_archive(work, BIG_FILLER_BYTES)
    builds = [(small, ref, f"variant={n}") for n, ref in enumerate(made.small)] + [(big, made.big, "variant=big")]
    builds.append((small, made.secret, "variant=secret"))
    try:
        for archive, ref, label in builds:
            changes = ["--change", "ENV PATH=/bin", "--change", f"LABEL {label}", "--change", 'CMD ["sleep", "300"]']
            builder.podman("import", "--quiet", *changes, str(archive), ref)
            creds = ["--creds", f"{USER}:{PASSWORD}"] if ref == made.secret else []
            builder.podman("push", "--quiet", "--tls-verify=false", *creds, ref, timeout_s=120)
            builder.podman("rmi", ref)
        yield made
    finally:
        public.stop()
        private.stop()


@contextlib.contextmanager
def pulling_engine(workdir: Path, images: Images) -> Iterator[PodmanService]:
    """The host's engine: its own Podman state, none of the pushed images, both registries marked plain HTTP."""
    service = PodmanService(workdir / "podman")
    service.workdir.mkdir(parents=True, exist_ok=True)
    hosts = [images.public.host, images.private.host, f"127.0.0.1:{images.slow_port}"]
    conf = insecure_registries_conf(workdir / "registries.conf", hosts)
    service.env["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    try:
        service.start()
    except PodmanUnavailable as exc:
        service.stop()
        pytest.fail(f"the host's Podman service could not start: {exc}", pytrace=False)
    try:
        yield service
    finally:
        service.stop()
