"""``python -m bench api-pages`` works end to end at a small size; its speed is in bench/README.md, not checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_api_pages_benchmark_pages_through_a_small_fleet_and_reports_its_figures(tmp_path):
    out = tmp_path / "pages.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "api-pages", "--agents", "50", "--limit", "30", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert (figures["gpus"], figures["pages"], figures["every_gpu_once_in_order"]) == (400, 14, True)
    assert {"page_p50_ms", "page_p99_ms", "page_max_ms", "sort_every_gpu_ms"} <= figures.keys()
    assert "page latency p50 / p99 / max ms" in done.stdout
