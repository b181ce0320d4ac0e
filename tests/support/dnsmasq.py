"""A real DNS server for tests: dnsmasq on 127.0.0.1, serving one zone from records the test chooses.

What matters about dnsmasq 2.90 here:

- Records go into a conf file of their own (``--conf-file``), not onto the command line: on the command line
  ``--txt-record`` splits its value at every comma into separate strings, while in a conf file a quoted value
  stays one string. Naming our file also keeps dnsmasq from reading the host's /etc/dnsmasq.conf.
- ``--local=/ZONE/`` makes names of the zone that have no record answer NXDOMAIN. Without it dnsmasq, having
  no upstream (``--no-resolv``), answers REFUSED, which is what any name outside the zone still gets.
- SRV and TXT answers carry ``--local-ttl`` (default 0); host records take a TTL of their own
  (``--host-record=name,address,ttl``). SRV answers list the targets' A/AAAA records in the additional section.
- Replacing records means a restart on the same port: SIGHUP rereads hosts files, never srv-host or txt-record.
- As root dnsmasq switches to user ``nobody`` unless told ``--user=root``; logs go to a file (``--log-facility``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import dns.exception
import dns.message
import dns.query
import pytest

from tests.support.processes import stop_process

START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
START_ATTEMPTS = 3  # a free port can be taken by someone else before dnsmasq binds it
LISTEN_ADDRESS = "127.0.0.1"


class DnsmasqUnavailable(RuntimeError):
    """dnsmasq is not installed or would not start; the message says what to do."""


@dataclass(frozen=True)
class SrvRecord:
    name: str
    target: str
    port: int
    priority: int = 0
    weight: int = 0

    def conf_line(self) -> str:
        return f"srv-host={self.name},{self.target},{self.port},{self.priority},{self.weight}"


@dataclass(frozen=True)
class TxtRecord:
    name: str
    value: str  # one character-string; commas are kept

    def conf_line(self) -> str:
        if '"' in self.value or "\n" in self.value:
            raise ValueError(f"TXT value {self.value!r} cannot hold a quote or a newline in a dnsmasq conf file")
        return f'txt-record={self.name},"{self.value}"'


@dataclass(frozen=True)
class HostRecord:
    name: str
    address: str
    ttl: int | None = None  # None: --local-ttl

    def conf_line(self) -> str:
        ttl = "" if self.ttl is None else f",{self.ttl}"
        return f"host-record={self.name},{self.address}{ttl}"


Record = SrvRecord | TxtRecord | HostRecord


def dnsmasq_program() -> str:
    # /usr/sbin is not on every user's PATH, and that is where Debian's dnsmasq-base puts it.
    found = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(p, os.X_OK)), None)
    if found is None:
        raise DnsmasqUnavailable(
            "dnsmasq is not installed, and the relay discovery tests need a real DNS server: apt-get install dnsmasq-base"
        )
    return found


def free_udp_tcp_port() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP (dnsmasq serves both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind((LISTEN_ADDRESS, 0))
            port = udp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((LISTEN_ADDRESS, port))
                except OSError:
                    continue
                return port
    raise DnsmasqUnavailable("found no port free for both UDP and TCP on 127.0.0.1")


class Dnsmasq:
    """One dnsmasq process serving ``zone`` on 127.0.0.1:``port``; a context manager that always stops it."""

    def __init__(self, zone: str = "idlegrid.test", *, local_ttl: int = 60, workdir: Path | None = None) -> None:
        self.zone = zone.strip(".")
        self.local_ttl = local_ttl
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="idlegrid-dnsmasq-"))
        self.records_path = self.workdir / "records.conf"
        self.log_path = self.workdir / "dnsmasq.log"
        self.address = LISTEN_ADDRESS
        self.port = 0
        self.records: list[Record] = []
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, records: Sequence[Record] = ()) -> Dnsmasq:
        program = dnsmasq_program()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_records(records)
        for _ in range(START_ATTEMPTS):
            self.port = free_udp_tcp_port()
            if self._launch(program):
                return self
        raise DnsmasqUnavailable(f"dnsmasq did not start after {START_ATTEMPTS} attempts; its log:\n{self.log_tail()}")

    def replace(self, records: Sequence[Record], *, local_ttl: int | None = None) -> None:
        """Serve ``records`` instead, on the same port (a restart: dnsmasq rereads no records on SIGHUP)."""
        self.stop()
        if local_ttl is not None:
            self.local_ttl = local_ttl
        self._write_records(records)
        if not self._launch(dnsmasq_program()):
            raise DnsmasqUnavailable(f"dnsmasq did not restart on port {self.port}; its log:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_process(process, STOP_TIMEOUT_S)

    def __enter__(self) -> Dnsmasq:
        return self if self._process is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _write_records(self, records: Sequence[Record]) -> None:
        self.records = list(records)
        self.records_path.write_text("".join(record.conf_line() + "\n" for record in self.records))

    def _arguments(self, program: str) -> list[str]:
        args = [
            program,
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            f"--port={self.port}",
            f"--listen-address={self.address}",
            "--bind-interfaces",
            f"--conf-file={self.records_path}",
            f"--pid-file={self.workdir / 'dnsmasq.pid'}",
            f"--log-facility={self.log_path}",
            f"--local=/{self.zone}/",
            f"--local-ttl={self.local_ttl}",
        ]
        if os.geteuid() == 0:
            args.append("--user=root")
        return args

    def _launch(self, program: str) -> bool:
        """Start dnsmasq on ``self.port``; whether it answers within START_TIMEOUT_S (False: it exited first)."""
        with self.log_path.open("ab") as log:  # startup errors (a port in use) come on stderr, before logging is set up
            self._process = subprocess.Popen(
                self._arguments(program), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
            )
        try:
            if self._wait_answering():
                return True
        except BaseException:  # interrupted: leave no server behind
            self.stop()
            raise
        self.stop()
        return False

    def _wait_answering(self) -> bool:
        assert self._process is not None
        query = dns.message.make_query(f"ready.{self.zone}.", "A")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                dns.query.udp(query, self.address, port=self.port, timeout=0.05)
                return True
            except (dns.exception.Timeout, OSError):
                time.sleep(0.01)
        return False


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[Dnsmasq]:
    """A started dnsmasq with no records yet (``replace`` gives it some); stopped after the test."""
    server = Dnsmasq(workdir=tmp_path / "dnsmasq")
    with server.start():
        yield server
