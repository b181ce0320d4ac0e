"""``python -m bench history`` runs end to end on a small grid and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.history import loop_time

REPO = Path(__file__).resolve().parents[2]


def test_the_history_benchmark_seeds_a_week_and_times_every_window(tmp_path):
    out = tmp_path / "history.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "history", "--gpus", "50", "--hosts", "20", "--filler-minutes", "2",
         "--rounds", "3", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    rows = {row["window"]: row for row in figures["rows"]}
    assert rows["week, step 1 min"]["points"] == 10_080 and rows["week, step 1 min"]["resolution_s"] == 60
    assert rows["week, step 1 h"]["resolution_s"] == 3600 and 168 <= rows["week, step 1 h"]["points"] <= 169
    assert rows["day, step 1 min"]["points"] in (1440, 1441)
    assert rows["host week, step 1 min"]["points"] == 10_080  # one host's own week, the same windows
    assert 168 <= rows["host week, step 1 h"]["points"] <= 169 and rows["host day, step 1 min"]["points"] in (1440, 1441)
    for row in figures["rows"]:
        for timed in (row["query"], row["answer"]):
            assert 0 < timed["p50_ms"] <= timed["p99_ms"] <= timed["max_ms"], row["window"]
    assert "target p99 < 100 ms" in done.stdout
    assert figures["loop"]["hourly_rollups"] == 50 + 20 and figures["loop"]["seconds"] >= 0


def test_the_loops_pass_runs_after_the_hour_of_the_last_minute_seeded_even_at_minute_zero():
    hour = 29_000 * 60  # a minute :00
    assert loop_time(hour) == hour * 60 + 1  # the minutes seeded end at :59 of the hour before: that hour is passed
    assert loop_time(hour + 5) == (hour + 60) * 60 + 1
    assert loop_time(hour + 60) == (hour + 60) * 60 + 1
