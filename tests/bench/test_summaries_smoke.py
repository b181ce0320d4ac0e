"""``python -m bench summaries`` runs end to end on a small fleet and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_summaries_benchmark_runs_a_small_fleet_and_reports_every_figure(tmp_path):
    out = tmp_path / "summaries.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "summaries", "--hosts", "50", "--rounds", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert (figures["hosts"], figures["gpus"], figures["rounds"]) == (50, 400, 2)
    assert [s["name"] for s in figures["summaries"]] == ["fleet_figures", "reputation", "fleet_scrape"]
    for s in figures["summaries"]:
        assert 0 < s["median_s"] <= s["max_s"] and s["target_s"] > 0, s
    assert "fleet_figures" in done.stdout and "< 500 ms" in done.stdout
