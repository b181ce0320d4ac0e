"""``python -m bench demo`` and ``python -m bench console-pages`` run end to end at a small size and report every
figure (speed is not checked here: bench/README.md has the figures beside their targets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


def bench(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.e2e
@pytest.mark.podman  # the demo starts its container host's Podman service where podman is installed
def test_the_demo_benchmark_times_one_run_of_the_demo_until_it_is_up(tmp_path):
    out = tmp_path / "demo.json"
    # The demo's first run on a fresh machine waits for a cold Podman (more than 120 s once in CI): the bench's own
    # bound (240 s) comes first, so a hang reads as the demo's last lines, not as a killed subprocess.
    done = bench("demo", "--runs", "1", "--json", str(out), timeout_s=330)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["runs"] == 1 and len(figures["up_s"]) == 1 and figures["up_s"][0] > 0
    assert figures["target_s"] == 20.0 and "fresh state directory" in done.stdout


@pytest.mark.e2e
def test_the_console_pages_benchmark_visits_each_page_of_a_small_fleet(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/setup-env --test installs it as root)")
    out = tmp_path / "console-pages.json"
    done = bench("console-pages", "--hosts", "60", "--rounds", "1", "--json", str(out), timeout_s=180)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert (figures["hosts"], figures["gpus"]) == (60, 480)
    assert [p["name"] for p in figures["pages"]] == ["hosts_first_page", "hosts_filtered", "fleet"]
    assert all(0 < p["best_ms"] <= p["max_ms"] for p in figures["pages"])
