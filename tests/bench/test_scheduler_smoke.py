"""``python -m bench scheduler`` runs end to end on a tiny grid and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scheduler_benchmark_runs_a_tiny_grid_and_reports_every_figure(tmp_path):
    out = tmp_path / "scheduler.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "scheduler", "--hosts", "40", "--queued", "60", "--steady-cycles", "20",
         "--arrivals", "3", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["gpus"] == 320 and figures["placements"] > 0
    assert figures["cycles"] == figures["backlog_cycles"] + 20
    for key in ("placements_per_s", "cycle_p50_ms", "cycle_p99_ms", "peak_rss_mib", "utilization"):
        assert figures[key] is not None and figures[key] > 0, key
    assert "placements per second" in done.stdout and "target" in done.stdout


def test_the_loop_snapshot_benchmark_runs_a_tiny_grid_and_reports_every_figure(tmp_path):
    out = tmp_path / "snapshot.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "scheduler-snapshot", "--hosts", "20", "--repeats", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert (figures["gpus"], len(figures["snapshot_s"]), len(figures["index_build_s"])) == (160, 2, 2)
    assert "snapshot, unit cache" in done.stdout
