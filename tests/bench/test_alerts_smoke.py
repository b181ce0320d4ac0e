"""``python -m bench alerts`` runs end to end on a small fleet and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_alerts_benchmark_times_a_quiet_fleet_and_a_hot_one(tmp_path):
    out = tmp_path / "alerts.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "alerts", "--agents", "50", "--hot", "20", "--rounds", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    quiet, hot = figures["phases"]
    assert figures["gpus"] == 400
    # The fleet-wide figures only: command failures and payouts unreconciled.
    assert (quiet["series"], quiet["kept_points"], quiet["transitions"]) == (2, 0, 0)
    assert hot["series"] == 22 and hot["transitions"] == 20  # 20 overheating GPUs fire, once each
    assert all(len(phase["step_ms"]) == len(phase["collect_ms"]) > 0 for phase in (quiet, hot))
    assert "observer memory" in done.stdout
