"""``python -m bench takeover`` runs end to end at a small size and reports every figure (speed is not checked here:
bench/README.md has the figures beside their target)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_the_takeover_benchmark_kills_a_leading_master_and_times_each_step_of_the_standby_taking_over(tmp_path):
    out = tmp_path / "takeover.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "takeover", "--runs", "1", "--agents", "4", "--commands", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(out.read_text())
    [run] = figures["each"]
    for step in ("serves_s", "relinked_s", "agents_ready_s", "commands_done_s"):  # one run: its own p50 and max
        assert figures[f"{step}_p50"] == figures[f"{step}_max"] == run[step], (step, figures)
    assert (run["commands_succeeded"], run["commands_executed"], run["duplicate_executions"]) == (2, 2, 0), run
    assert figures["every_command_once"] and figures["target_s"] == 15.0
    assert "target: the standby serves within 15 s" in done.stdout
