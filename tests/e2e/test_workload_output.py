"""Issue 23 acceptance 3: a workload's output outlives its container. On a real local grid (a Master, a relay and a
sandboxed process-runtime host, each its own process), a succeeded and a failed workload's output is read with
``idlegrid workload logs`` after their containers were deleted and again after the Master is SIGKILLed and started
again; another renter gets 404; output over the host's bound is cut with a marker; no replica stays ``deleting``
(also for a cancelled workload); a preempted and requeued workload's first attempt keeps its output; ``logs --follow``
ends by saying how the container ended. GPUs are simulated (none exists here)."""

from __future__ import annotations

import http.cookiejar
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from management.client.api import ApiClient
from tests.e2e.test_renter_access import cli
from tests.e2e.test_scheduler import MASTER_SETTINGS, SANDBOXED, renter, wait_workload, workload
from tests.support.grid import Grid, running_grid
from tests.support.podman import LOCAL_IMAGES_ALLOWED

KEEP_BYTES = 4096  # the host's bound, small enough for a test to cross it


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS, egress_allow=LOCAL_IMAGES_ALLOWED) as g:
        yield g


def host(grid: Grid, name: str = "host-0") -> str:
    env = {**SANDBOXED, "IDLEGRID_AGENT_OUTPUT_KEEP_BYTES": str(KEEP_BYTES)}
    agent_id, _ = grid.run_agent(name, simulate="a10:1", env=env)
    return agent_id


def settled(client: ApiClient, workload_id: str, state: str) -> dict[str, Any]:
    """The workload once ``state`` and every container of it deleted (its output read from its host)."""
    return wait_workload(
        client,
        workload_id,
        f"{state} with every container deleted",
        lambda w: w["state"] == state and w["assignments"] and all(a["state"] == "deleted" for a in w["assignments"]),
        timeout=40,
    )


def logs(grid: Grid, key: str, workload_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(grid, key, "workload", "logs", workload_id, "--tail", "-1", *args)


OK_SCRIPT = "echo hello-from-ok; echo second line"
FAIL_SCRIPT = "for i in 1 2 3 4 5; do echo step $i; done; echo 'Traceback: ValueError: boom' >&2; exit 3"
BIG_SCRIPT = "i=0; while [ $i -lt 3000 ]; do echo big-line-$i; i=$((i+1)); done"


def test_output_of_finished_workloads_is_kept_after_deletion_and_a_master_sigkill(grid: Grid) -> None:
    agent_id = host(grid)
    alice, bob = renter(grid, "alice"), renter(grid, "bob")
    ids = {}
    for name, script in (("ok", OK_SCRIPT), ("bad", FAIL_SCRIPT), ("big", BIG_SCRIPT)):
        ids[name] = alice.submit_workload(workload(name, script))["id"]
        settled(alice, ids[name], "failed" if name == "bad" else "succeeded")  # one GPU: one after the other
    assert not [c for c in grid.agent(agent_id)["containers"] if c.startswith("wl-")]  # deleted from the host

    def check() -> None:
        ok = logs(grid, alice.api_key, ids["ok"])
        assert ok.returncode == 0 and ok.stdout == "hello-from-ok\nsecond line\n", ok.stderr
        bad = logs(grid, alice.api_key, ids["bad"])
        assert bad.returncode == 0, bad.stderr
        assert bad.stdout == "step 1\nstep 2\nstep 3\nstep 4\nstep 5\nTraceback: ValueError: boom\n"
        assert cli(grid, alice.api_key, "workload", "logs", ids["bad"], "--tail", "1").stdout == "Traceback: ValueError: boom\n"
        failed = alice.workload(ids["bad"])
        # The renter sees why, not only the code: the reason ends with the last 3 lines of output (API, CLI, console).
        assert failed["state_reason"] == (
            "a container exited with code 3\nlast lines of replica 0:\nstep 4\nstep 5\nTraceback: ValueError: boom"
        )
        shown = cli(grid, alice.api_key, "workload", "get", ids["bad"])
        assert shown.returncode == 0, shown.stderr
        assert (
            "state:       failed  (a container exited with code 3)\n"
            "             last lines of replica 0:\n"
            "             step 4\n"
            "             step 5\n"
            "             Traceback: ValueError: boom\n"
        ) in shown.stdout
        [kept] = failed["outputs"]
        assert (kept["state"], kept["exit_code"], kept["attempt"], kept["host"]) == ("kept", 3, 1, agent_id)
        big = logs(grid, alice.api_key, ids["big"])
        assert big.stdout.startswith("[idlegrid: output cut: the first ") and big.stdout.endswith("big-line-2999\n")
        assert len(big.stdout) < KEEP_BYTES + 100
        assert alice.workload(ids["big"])["outputs"][0]["truncated"] is True
        for workload_id in ids.values():
            refused = logs(grid, bob.api_key, workload_id)
            assert refused.returncode != 0 and f"404 not_found: no workload {workload_id!r}" in refused.stderr
            assert all(a["state"] == "deleted" for a in alice.workload(workload_id)["assignments"])

    check()
    grid.client.set_password("alice", CONSOLE_PASSWORD)
    console = signed_in(grid, "alice")
    assert_console_shows(console, grid, ids)
    assert grid.master is not None
    assert "Warning" not in grid.master.log.read_text()  # no third-party warning under the operator's eyes
    grid.master.kill(signal.SIGKILL)
    grid.restart_master()
    check()
    assert_console_shows(signed_in(grid, "alice"), grid, ids)  # read again, from the restarted Master's store


CONSOLE_PASSWORD = "alice-console-password-1"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def signed_in(grid: Grid, account: str) -> urllib.request.OpenerDirector:
    """A browser's session in the console: the sign-in form (its CSRF token, the Origin header), then its cookie."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(f"{grid.api_url}/console/signin", timeout=10) as answer:
        token = CSRF.search(answer.read().decode())
    assert token is not None
    form = urllib.parse.urlencode(
        {"account": account, "password": CONSOLE_PASSWORD, "csrf_token": token.group(1), "next": "/console/"}
    ).encode()
    request = urllib.request.Request(f"{grid.api_url}/console/signin", data=form, headers={"Origin": grid.api_url})
    with opener.open(request, timeout=10) as answer:
        assert answer.status == 200
    return opener


def assert_console_shows(console: urllib.request.OpenerDirector, grid: Grid, ids: dict[str, str]) -> None:
    def page(workload_id: str) -> str:
        with console.open(f"{grid.api_url}/console/workloads/{workload_id}", timeout=10) as answer:
            return answer.read().decode()

    ok, bad = page(ids["ok"]), page(ids["bad"])
    assert 'id="output-h"' in ok and "hello-from-ok\nsecond line" in ok
    assert "Replica 0, attempt 1: exit code 3" in bad and "step 5\nTraceback: ValueError: boom" in bad
    reason = re.search(r'<p id="workload-reason" class="reason">([^<]*)</p>', bad)
    assert reason is not None and reason.group(1).endswith(
        "last lines of replica 0:\nstep 4\nstep 5\nTraceback: ValueError: boom"
    )


def test_a_cancelled_workload_reaches_deleted_and_keeps_what_it_printed(grid: Grid) -> None:
    host(grid)
    alice = renter(grid, "alice")
    workload_id = alice.submit_workload(workload("long", "echo working; exec sleep 600"))["id"]
    wait_workload(alice, workload_id, "running", lambda w: w["state"] == "running")
    assert "working" in wait_logs(grid, alice.api_key, workload_id, "working")

    alice.cancel_workload(workload_id)

    settled(alice, workload_id, "cancelled")  # was: its assignment stayed deleting for ever
    # What it printed, then what came on its way out (the sandbox's shell reports its SIGTERM: "Terminated").
    assert logs(grid, alice.api_key, workload_id).stdout.startswith("working\n")


def wait_logs(grid: Grid, key: str, workload_id: str, text: str) -> str:
    from tests.support.grid import wait_for

    return wait_for(
        lambda: text in (out := logs(grid, key, workload_id).stdout) and out, 20, f"{text!r} in {workload_id}'s output"
    )


def test_a_preempted_and_requeued_workloads_first_attempt_keeps_its_output(grid: Grid) -> None:
    host(grid)
    alice = renter(grid, "alice")
    low = alice.submit_workload(
        workload("low", "echo attempt-output $IDLEGRID_ATTEMPT; exec sleep 600", priority="low", restart_policy="on_failure")
    )["id"]
    wait_workload(alice, low, "running", lambda w: w["state"] == "running")
    wait_logs(grid, alice.api_key, low, "attempt-output")
    high = alice.submit_workload(workload("high", "echo high; exec sleep 600", priority="high"))["id"]
    wait_workload(alice, high, "running", lambda w: w["state"] == "running", timeout=40)
    requeued = wait_workload(alice, low, "requeued with its first output kept", lambda w: w["outputs"], timeout=40)
    assert requeued["state"] == "queued" and requeued["preemptions"] == 1

    first = wait_workload(alice, low, "its first output read", lambda w: w["outputs"][0]["state"] == "kept")
    assert first["outputs"][0]["attempt"] == 1
    kept = cli(grid, alice.api_key, "workload", "logs", low, "--attempt", "1")
    assert kept.returncode == 0 and kept.stdout.startswith("attempt-output"), kept.stderr
    alice.cancel_workload(high)
    alice.cancel_workload(low)


def test_logs_follow_ends_by_saying_how_the_container_ended(grid: Grid) -> None:
    host(grid)
    alice = renter(grid, "alice")
    workload_id = alice.submit_workload(workload("follow", "echo begun; sleep 3; echo over; exit 4"))["id"]
    wait_workload(alice, workload_id, "running", lambda w: w["state"] == "running")

    followed = cli(grid, alice.api_key, "workload", "logs", workload_id, "--follow", timeout=60)

    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "begun\nover\n"
    assert "[idlegrid] replica 0 ended: exit code 4; workload failed: a container exited with code 4" in followed.stderr


@pytest.mark.podman
def test_a_podman_hosts_failed_workload_keeps_its_output_after_its_container_is_deleted(grid: Grid, podman: Any) -> None:
    """The same through the docker runtime against a real Podman behind the relay: stdout and stderr both kept."""
    assert grid.enroll("podman-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("podman-host")
    grid.start_podman_agent("podman-host", podman)
    grid.wait_state(agent_id, "ready")
    alice = renter(grid, "alice")
    script = "echo from-podman; echo 'Traceback: RuntimeError: no data' >&2; exit 5"
    submitted = alice.submit_workload(
        {"name": "pod", "image": podman.image, "command": ["sh", "-c", script], "replica": {"gpus": 1}}
    )
    failed = settled(alice, submitted["id"], "failed")
    assert failed["state_reason"].endswith("Traceback: RuntimeError: no data")
    assert not podman.podman("ps", "--all", "--quiet", "--filter", f"name={submitted['id']}").stdout.strip()  # deleted
    kept = logs(grid, alice.api_key, submitted["id"])
    assert kept.returncode == 0 and sorted(kept.stdout.splitlines()) == ["Traceback: RuntimeError: no data", "from-podman"]
    assert alice.workload(submitted["id"])["outputs"][0]["exit_code"] == 5
