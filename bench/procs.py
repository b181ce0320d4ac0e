"""The processes a benchmark starts: spawned in their own session, measured from /proc, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_TICKS = os.sysconf("SC_CLK_TCK")
STOP_TIMEOUT_S = 10.0


@dataclass
class Usage:
    """One reading of a process: resident memory and CPU time so far."""

    rss_kib: int
    cpu_s: float


def read_usage(pid: int) -> Usage:
    """RSS from /proc/PID/status, user + system CPU from /proc/PID/stat."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return Usage(rss_kib=rss, cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS)


@dataclass
class BenchProcess:
    name: str
    popen: subprocess.Popen
    log: Path
    readings: dict[str, Usage] = field(default_factory=dict)  # label -> reading

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def read(self, label: str) -> Usage:
        self.readings[label] = reading = read_usage(self.pid)
        return reading

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to its session, then SIGKILL if it has not exited in ``timeout`` seconds."""
        if not self.alive():
            return
        with _ignore_missing():
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with _ignore_missing():
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=timeout)

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class _ignore_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)


def spawn(name: str, args: list[str], logs: Path, *, env: dict[str, str] | None = None) -> BenchProcess:
    """``python -m ARGS`` from the repository root, in a session of its own, its output to logs/NAME.log."""
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    return BenchProcess(name, popen, log)
