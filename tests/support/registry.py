"""A real image registry for tests: Debian's ``docker-registry`` (the CNCF distribution registry, 2.8) on 127.0.0.1.

Plain HTTP on a free port with a filesystem store in a temp directory; ``private=True`` puts every repository behind
htpasswd (bcrypt) basic auth. The distribution registry has no per-repository auth, so a test that wants one public
and one private repository runs two registries. Engines must be told the registry is insecure (plain HTTP):
``podman push --tls-verify=false``, and a ``registries.conf`` (``insecure_registries_conf``) for a pulling engine.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.support.processes import stop_process

USER, PASSWORD = "renter", "s3cret-registry-pass"


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

            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()  # 4: cheap, it is a test
            (self.workdir / "htpasswd").write_text(f"{USER}:{hashed}\n")
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


def insecure_registries_conf(path: Path, registries: Sequence[Registry]) -> Path:
    """A ``registries.conf`` marking ``registries`` as plain HTTP, for an engine's ``CONTAINERS_REGISTRIES_CONF``."""
    path.write_text("".join(f'[[registry]]\nlocation = "{r.host}"\ninsecure = true\n\n' for r in registries))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
