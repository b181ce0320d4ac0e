"""``python -m bench demo`` and ``python -m bench console-pages`` run end to end at a small size and report every
figure (speed is not checked here: bench/README.md has the figures beside their targets)."""

from __future__ import annotations

import json
import os
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


@pytest.mark.e2e
@pytest.mark.podman  # a Podman host and a local registry: the Podman part of the suite, one at a time
@pytest.mark.skipif(os.geteuid() != 0, reason="the endpoint bench's process hosts are sandboxed: root only")
def test_the_endpoints_benchmark_times_cold_starts_on_a_podman_host_with_the_image_there_and_pulled(tmp_path):
    out = tmp_path / "endpoints.json"
    done = bench(
        "endpoints",
        *("--hosts", "1", "--gpus-per-host", "1", "--workers", "1", "--concurrency", "1", "--single-s", "0.5"),
        *("--clients", "2", "--load-s", "0.5", "--cmd-rate", "2", "--idle-s", "0.5", "--starts", "1", "--scale-to", "1"),
        *("--podman-starts", "1", "--podman-pull-starts", "1", "--json", str(out)),
        timeout_s=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    podman = json.loads(out.read_text())["podman"]
    [on_host] = podman["starts"]
    assert on_host["pull"] is None  # the offline image is on the host
    [pulled] = podman["pulled"]["starts"]
    assert pulled["pull"] > 0 and not pulled["warm"]  # taken off the host first: this start pulled it
    for s in (on_host, pulled):  # the phases cut the start
        parts = s["wake"] + s["placement"] + (s["pull"] or 0) + s["start"] + s["first_ready"]
        assert parts == pytest.approx(s["total"], abs=0.01), s
    assert podman["pulled"]["image_bytes"] > 1_000_000
    assert "pulled" in done.stdout and "on Podman (s)" in done.stdout
