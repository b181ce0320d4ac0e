"""``python -m bench cli-start`` runs end to end and reports every figure (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.cli_start import parse_importtime

REPO = Path(__file__).resolve().parents[2]


def test_the_cli_start_benchmark_runs_each_command_and_reports_cpu_and_imports(tmp_path):
    out = tmp_path / "cli-start.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "cli-start", "--runs", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    commands = figures["trees"]["this tree"]
    assert set(commands) == {"python -c pass", "--help", "workload list", "offers search"}
    for name, r in commands.items():
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], name
        if name != "python -c pass":
            assert r["modules"] > 0 and r["top_modules_ms"] and r["top_packages_ms"], name
            assert r["heavy_imported"] == [], name
    assert "target: median < 0.25 s of CPU" in done.stdout and "costliest modules ms" in done.stdout


def test_importtime_lines_are_read_as_self_and_cumulative_microseconds():
    stderr = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   _io\n"
        "import time:      2000 |       5000 | management.cli.main\n"
        "unrelated line\n"
    )
    assert parse_importtime(stderr) == {"_io": (120, 120), "management.cli.main": (2000, 5000)}
