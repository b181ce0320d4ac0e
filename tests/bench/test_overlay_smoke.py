"""``python -m bench.overlay`` works end to end at a small size: the overlay's paths, and the grid's commands through the
Access relay in the lighthouse's namespace while the relayed pair streams; speed is not checked here (bench/README.md).

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2/iptables, no TUN) or Debian's nebula
is not installed (scripts/setup-env installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.netns import available

REPO = Path(__file__).resolve().parents[2]
_why = available() or ("" if shutil.which("nebula") else "Debian's nebula is not installed (scripts/setup-env)")


@pytest.mark.e2e
@pytest.mark.skipif(bool(_why), reason=_why or "runs")
def test_the_overlay_benchmark_times_commands_through_the_relay_idle_and_while_the_overlay_streams(tmp_path):
    out = tmp_path / "overlay.json"
    args = ["--mib", "2", "--pings", "50", "--no-wireguard", "--hosts", "1", "--cmd-rate", "10", "--replica-nice", "10"]
    args += ["--idle-s", "1.5", "--bulk-s", "1.5", "--json", str(out)]
    split = len(os.sched_getaffinity(0)) >= 2  # the replicas' side on a CPU of its own needs two
    args += ["--split-cores"] if split else []
    done = subprocess.run([sys.executable, "-m", "bench.overlay", *args], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["direct"]["path"] == "direct" and result["relay"]["path"] == "relay"
    assert result["wireguard"] is None  # --no-wireguard
    for path in ("direct", "relay"):
        assert result[path]["mib_per_s"] > 0 and 0 < result[path]["rtt_p50_ms"] <= result[path]["rtt_p99_ms"]
    commands = result["commands"]
    # the bulk crossed the relay whose host the Access relay shares; the control's stream did not
    assert commands["paths"] == {"bulk": "relay", "direct": "direct"}
    assert commands["errors"] == []
    for phase in ("idle", "bulk", "direct"):
        assert commands[phase]["commands"] > 0 and commands[phase]["cmd_p99_ms"] > 0
    for phase in ("bulk", "direct"):
        assert commands["ratios"][f"{phase}_cmd"] == pytest.approx(
            commands[phase]["cmd_p99_ms"] / commands["idle"]["cmd_p99_ms"], abs=0.01
        )
        [transfer] = commands["transfers"][phase]
        assert transfer["bytes"] > 0 and transfer["seconds"] >= 1.5
    assert result["relay_limit_mib"] == 8  # the grid's bound by default
    assert commands["options"]["replica_nice"] == 10
    assert commands["options"]["split_cores"] is split and ("on a CPU of its own" in done.stdout) is split
    assert commands["cpu_cores"].keys() == {
        "master", "relay", "lighthouse nebula", "relayed pair's nebulas", "direct pair's nebulas"
    }  # fmt: skip
    assert "bulk/idle p99: commands" in done.stdout  # the readable table
