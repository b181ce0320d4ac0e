"""The handler library works wherever an image carries it: its folder copied under another name, in an interpreter
with the standard library alone (no site-packages, nothing of idlegrid), as the main program of a process that
SIGTERM ends cleanly. The dependency rule's test (tests/test_dependency_rule.py) checks its imports statically."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.common.endpoint_worker.agent_standin import WAIT_S, AgentStandIn

LIBRARY = Path(__file__).resolve().parents[3] / "common" / "endpoint_worker"

WORKER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from idlegrid_worker import serve

    def handler(request):
        ours = sorted(name for name in sys.modules if name.split(".")[0] in {"common", "agent", "management", "msgspec"})
        return {"echo": request.input, "ours": ours, "site": "site" in sys.modules}

    serve(handler)
    print("served", flush=True)
    """
)


def test_the_library_copied_into_a_bare_interpreter_serves_and_ends_on_sigterm(tmp_path):
    shutil.copytree(LIBRARY, tmp_path / "idlegrid_worker", ignore=shutil.ignore_patterns("__pycache__"))
    agent = AgentStandIn().start()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", WORKER, str(tmp_path)],
        env=agent.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        agent.submit("r1", "hello")
        agent.wait_for(lambda: "r1" in agent.results)
        agent.wait_for(lambda: len(agent.heartbeats) >= 1)  # serve() is past its SIGTERM handler's setup
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        agent.stop()
    assert process.returncode == 0, err
    assert out.strip() == "served"
    assert agent.results["r1"] == {"echo": "hello", "ours": [], "site": False}
