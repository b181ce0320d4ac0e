"""Where the time goes: py-spy samples each process of a run, and the stacks are summed per function."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

SAMPLE_RATE_HZ = 100
TOP = 15


class Profiler:
    """``py-spy record`` on several processes at once, for a fixed duration, without pausing them (--nonblocking)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._running: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.error = ""

    def start(self, pids: dict[str, int], seconds: float) -> None:
        # Beside this interpreter first: a virtual environment's scripts are there even when it is not activated.
        beside = Path(sys.executable).parent / "py-spy"
        program = str(beside) if beside.exists() else shutil.which("py-spy")
        if program is None:
            self.error = "py-spy is not installed (pip install -e '.[bench]')"
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            raw = self.out_dir / f"{name}.txt"
            log = open(self.out_dir / f"{name}.py-spy.log", "wb")
            process = subprocess.Popen(
                [
                    program,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(max(1, int(seconds))),
                    "--rate",
                    str(SAMPLE_RATE_HZ),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(raw),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            self._running[name] = (process, raw)

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """End every recording (bounded), then summarise each; the summary is also written to summary.json."""
        if self.error:
            return {"error": self.error}
        summary: dict[str, Any] = {}
        for process, _ in self._running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # py-spy writes what it has so far and exits
        for name, (process, raw) in self._running.items():
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            summary[name] = summarise(raw) if raw.exists() else {"error": f"no profile (see {name}.py-spy.log)"}
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return {name: {k: v[:8] if isinstance(v, list) else v for k, v in s.items()} for name, s in summary.items()}


def summarise(raw: Path, top: int = TOP) -> dict[str, Any]:
    """Per function: share of samples where it was running (self) and where it was on the stack (total)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        samples += count
        own[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            total[frame] += count

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[frame, round(100 * n / samples, 1)] for frame, n in counter.most_common(top)] if samples else []

    return {"samples": samples, "self_pct": share(own), "total_pct": share(total)}


def _short(frame: str) -> str:
    """``func (/long/path/to/pkg/module.py:123)`` -> ``func (pkg/module.py)``: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    return f"{name} ({'/'.join(parts[-2:])})" if path else name
