"""The daemons' interpreter settings, applied in a process of their own (they are process-wide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_daemon_with_a_worker_thread_gets_the_interpreter_back_within_a_millisecond() -> None:
    code = (
        "import gc, sys\n"
        "from common.heap import share_the_interpreter_quickly, tune_for_daemon\n"
        "before = sys.getswitchinterval()\n"
        "tune_for_daemon(); share_the_interpreter_quickly()\n"
        "print(before, sys.getswitchinterval(), gc.get_threshold()[0], gc.get_freeze_count() > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    before, after, young, frozen = out.split()
    assert float(before) == 0.005 and float(after) == 0.001  # CPython's 5 ms, then 1 ms
    assert int(young) == 20_000 and frozen == "True"
