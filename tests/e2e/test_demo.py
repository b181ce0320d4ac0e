"""Acceptance 8: the README's demo command brings up at least 8 ready agents within 20 s, and Ctrl-C leaves nothing behind."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.grid import REPO, free_port, wait_for


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def ready_agents(api: str, token_file: Path) -> int:
    request = urllib.request.Request(
        f"{api}/api/v1/agents", headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}
    )
    with urllib.request.urlopen(request, timeout=2) as response:
        return sum(1 for a in json.loads(response.read())["items"] if a["state"] == "ready")


def test_demo_brings_up_eight_ready_agents_within_20_seconds_and_stops_cleanly(tmp_path):
    state_dir, port = tmp_path / "demo", free_port()
    started = time.monotonic()
    demo = subprocess.Popen(
        [sys.executable, "-m", "management.cli", "demo", "--state-dir", str(state_dir), "--api-port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        api = f"http://127.0.0.1:{port}"
        token_file = state_dir / "operator.token"
        wait_for(lambda: token_file.exists() and ready_agents(api, token_file) >= 8, 20, "8 ready agents", interval=0.25)
        elapsed = time.monotonic() - started
        print(f"demo: 8 agents ready after {elapsed:.1f} s")
        assert elapsed <= 20
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    finally:
        demo.send_signal(signal.SIGINT)  # what Ctrl-C does
        output, _ = demo.communicate(timeout=30)
    assert demo.returncode == 0, output
    assert f"{api}/api/v1/agents" in output
    wait_for(lambda: processes_mentioning(str(state_dir)) == [], 5, "every demo process to exit")
