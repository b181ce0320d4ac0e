"""``python -m bench demo``: how long the README's first command takes to say the grid is up.

``idlegrid demo`` (``python -m management.cli demo``) is started on a fresh state directory, then again on the same one
(its restart: the ports, the agents and their enrollment reused), each time from the process's start to its
"idlegrid demo is up" line (a Master, two relays and 8 simulated agents, every agent ready, and its container host
where Podman is installed: the fresh run builds its images), then stopped with SIGINT
as Ctrl-C would. Target: up within 20 s each time (tests/e2e/test_demo.py checks what the demo does; it asserted this
speed until 2026-11-27).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from management.devgrid.demo import CONTAINER_HOST_DEADLINE_S
from management.devgrid.localgrid import free_port

TARGET_S = 20.0
UP_LINE = "idlegrid demo is up"
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DemoBenchOptions:
    runs: int = 2  # the first on a fresh state directory, the others restarts on it
    # Past the demo's own wait for its container host (a cold Podman's first containers took more than two minutes in
    # a fresh machine's CI), with room for the rest: the bench times how long it takes, a bound only catches a hang.
    timeout_s: float = CONTAINER_HOST_DEADLINE_S + 90.0


def _time_one_run(state_dir: Path, api_port: int, timeout_s: float) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "management.cli", "demo", "--state-dir", str(state_dir), "--api-port", str(api_port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    up = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if UP_LINE in line:
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not up.wait(timeout_s):
            raise RuntimeError(f"the demo did not say it was up in {timeout_s:g} s:\n{''.join(lines[-30:])}")
        return time.perf_counter() - started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # Ctrl-C: agents, relays, then the Master stop
        process.wait(timeout=60)
        reader.join(timeout=5)


def run_demo_bench(options: DemoBenchOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state_dir, api_port = Path(tmp) / "demo", free_port()
        up_s = [round(_time_one_run(state_dir, api_port, options.timeout_s), 2) for _ in range(options.runs)]
    return {"runs": options.runs, "up_s": up_s, "target_s": TARGET_S, "met": max(up_s) <= TARGET_S}


def demo_table(r: dict[str, Any]) -> str:
    lines = [f"{'run':<22} {'up after':>9}  target"]
    for n, up_s in enumerate(r["up_s"]):
        name = "fresh state directory" if n == 0 else f"restart {n}"
        lines.append(f"{name:<22} {up_s:>7.1f} s  <= {r['target_s']:g} s {'met' if up_s <= r['target_s'] else 'MISSED'}")
    return "\n".join(lines)
