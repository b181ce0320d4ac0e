"""MongoDB for tests: an nx-27017 server the suite starts and always stops, or a real mongod named by MONGODB_URI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.grid import free_port
from tests.support.processes import stop_process

NX_PROGRAM = "nx-27017"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it
MONGODB_URI_ENV = "MONGODB_URI"


class MongoServerError(RuntimeError):
    """The test MongoDB server could not be started."""


def real_mongodb_uri() -> str | None:
    """The URI of a real mongod to test against as well, from ``MONGODB_URI``, or None."""
    return os.environ.get(MONGODB_URI_ENV) or None


def database_url(server_uri: str, database: str) -> str:
    """``server_uri`` (its options kept) pointing at ``database``."""
    parts = urlsplit(server_uri)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


def nx27017_program() -> str:
    """The nx-27017 executable of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name(NX_PROGRAM)
    found = str(beside) if beside.is_file() else shutil.which(NX_PROGRAM)
    if found is None:
        raise MongoServerError(
            f"{NX_PROGRAM} is not installed, and the MongoDB store tests need it: pip install 'nx-27017>=0.8' "
            "(the test extra of pyproject.toml installs it)"
        )
    return found


class Nx27017:
    """One ``nx-27017 --db memory`` process on a free port of 127.0.0.1."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log = workdir / "nx-27017.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?serverSelectionTimeoutMS=5000"

    def start(self) -> Nx27017:
        program = nx27017_program()
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(START_ATTEMPTS):
            self.port = free_port()
            self._process = self._spawn(program)
            try:
                ready = self._wait_ready()
            except BaseException:  # interrupted: leave no server behind
                self.stop()
                raise
            if ready:
                return self
            self.stop()
        raise MongoServerError(f"{NX_PROGRAM} did not start after {START_ATTEMPTS} attempts; its log:\n{self._log_tail()}")

    def _spawn(self, program: str) -> subprocess.Popen[bytes]:
        # Its own pid and log files: by default every instance shares /tmp/nx_27017.{pid,log}.
        args = [
            program,
            "--db",
            "memory",
            "--host",
            "127.0.0.1",
            "-p",
            str(self.port),
            "--pid-file",
            str(self.workdir / f"nx-27017-{self.port}.pid"),
            "--log-file",
            str(self.log),
        ]
        with self.log.open("ab") as log:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self) -> bool:
        """Whether the server accepts connections within START_TIMEOUT_S; False if it exits first."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_process(process, STOP_TIMEOUT_S)

    def _log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
