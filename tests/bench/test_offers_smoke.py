"""``python -m bench offers`` runs end to end on a small market and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_offers_benchmark_runs_a_small_market_and_reports_every_figure(tmp_path):
    out = tmp_path / "offers.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "offers", "--hosts", "300", "--rounds", "3", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert (figures["hosts"], figures["gpus"], figures["offers"]) == (300, 2400, 300)
    names = [q["name"] for q in figures["queries"]]
    assert "issue example" in names and any(q["page"] > 1 for q in figures["queries"])
    empty = next(q for q in figures["queries"] if q["name"] == "nothing matches")
    assert empty["matched"] == 0 and empty["emptied_by"]
    for q in figures["queries"]:
        assert q["p50_ms"] > 0 and q["p99_ms"] >= q["p50_ms"], q["name"]
    assert figures["p99_ms"] > 0 and figures["churn"]["update_p99_ms"] > 0
    assert "target p99 < 50 ms" in done.stdout and "a host changed, then search" in done.stdout
