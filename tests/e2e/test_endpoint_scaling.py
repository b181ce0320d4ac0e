"""Endpoints whose workers the autoscaler brings up, on a real local grid: the Master whole (its request book and the
endpoints' autoscaler inside), a relay and sandboxed process-runtime hosts with simulated GPUs, each its own process
(tests/support/grid.py). Requests go through the request routes over HTTP with the endpoint's invocation key, as a
renter's client sends them (docs/endpoints.md, "The request routes").

- A burst at an endpoint with no worker brings workers up (ordinary workloads of the renter, placed by the
  scheduler), the real handler library in each takes the requests through its agent, every request completes once,
  and with nothing left to do the workers go back to zero after the idle timeout.
- A worker SIGKILLed mid-request: its agent tells the Master, the request goes back to the queue, the autoscaler
  replaces the worker, and the request completes on the new one as attempt 2, once.
- A host SIGKILLed mid-request (its agent, so no word of the worker's end reaches the Master): the request goes back to
  the queue by the Master's host-loss rules and completes on the other host as attempt 2, once.
- A cancel of a running request reaches its worker (the handler sees ``request.cancelled`` at the worker's next
  heartbeat) and frees it for the next request; a request at an endpoint where no worker may start ends TIMED_OUT
  at its TTL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_endpoint_workers import CARRIED_HANDLER, LIBRARY_ENV, SYSTEM_PYTHON, Endpoint, _library_zip
from tests.support.grid import Grid, host_pid, pid_alive, wait_for, write_toml

MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "preemption_grace_s": 3.0,
    "offer_sandboxed_hosts": True,
    "requeue_offline_after_s": 3.0,  # a lost host's workloads go elsewhere 3 s after it goes offline
}
SANDBOXED = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}
# A worker that tells who it is (its pid, start time and PID namespace as its own /proc shows them: host_pid finds the
# host's pid from them) in its request's progress, then blocks: its first attempt until the worker is killed (or the
# request cancelled), a later attempt not at all. Every output says which attempt made it and which cancels this
# worker process has seen.
BLOCKING_HANDLER = (
    CARRIED_HANDLER.rsplit("from idlegrid_worker", 1)[0]
    + """
import time
from idlegrid_worker import serve

seen_cancelled = []


def handler(request):
    given = request.input
    if isinstance(given, dict) and given.get("block") and request.attempt == 1:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        me = f"{os.getpid()} {fields[19]} {os.readlink('/proc/self/ns/pid')}"
        request.progress({"me": me})
        deadline = time.monotonic() + 300
        while not request.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        if request.cancelled:
            seen_cancelled.append(request.id)
        return "unblocked"
    return {"echo": given, "attempt": request.attempt, "seen_cancelled": list(seen_cancelled)}


serve(handler)
"""
)

GATE_ENV = "IDLEGRID_TEST_GATE"
# A worker whose handler holds each request until the file the environment names exists (at most 120 s).
GATED_HANDLER = (
    CARRIED_HANDLER.rsplit("from idlegrid_worker", 1)[0]
    + f"""
import time
from idlegrid_worker import serve


def handler(request):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["{GATE_ENV}"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {{"echo": request.input}}


serve(handler)
"""
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="sandboxed hosts need root and a system Python"
    ),
]


@pytest.fixture
def scaling_grid(tmp_path: Path) -> Iterator[Grid]:
    g = Grid(tmp_path / "grid")
    try:
        g.start_master("--config", str(write_toml(tmp_path / "master.toml", MASTER_SETTINGS)))
        g.start_relay("relay-1", "eu-west")
        assert g.client.create_account("ana", "renter")["id"] == "ana"  # Endpoint makes ana's endpoints
        yield g
    finally:
        g.stop()


def autoscaled(grid: Grid, name: str, handler: str, *, env: dict[str, str] | None = None, **spec: Any) -> Endpoint:
    """An endpoint of renter ana whose sandboxed workers carry the handler library (as an image would) and run
    ``handler``, with one invocation key."""
    return Endpoint(
        grid,
        name,
        command=[SYSTEM_PYTHON, "-c", handler],
        env={LIBRARY_ENV: _library_zip(), "IDLEGRID_WORKER_HEARTBEAT_S": "0.5", **(env or {})},
        replica={"gpus": 1},
        **spec,
    )


def workers_of(grid: Grid, name: str) -> list[dict[str, Any]]:
    """The worker workloads of ana's endpoint ``name`` (each named as its endpoint), oldest first."""
    items = grid.get("/api/v1/workloads?account=ana")["items"]
    return sorted((w for w in items if w["spec"]["name"] == name), key=lambda w: w["created_at"])


def test_requests_at_an_endpoint_with_no_worker_bring_workers_up_from_zero_and_complete(scaling_grid, drop):
    grid = scaling_grid
    for n in range(2):
        grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED)
    gate = drop / "go"
    echo = autoscaled(
        grid,
        "echo",
        GATED_HANDLER,
        env={GATE_ENV: str(gate)},
        # Requests waiting while no worker is ready (or, once one is, past the 1 s delay target): the autoscaler wants
        # ceil(4 / 1) workers, capped at max_workers 2.
        scaling={"max_workers": 2, "idle_timeout_s": 3, "concurrency": 1, "target_queue_delay_s": 1},
    )
    assert workers_of(grid, "echo") == []
    submitted = [echo.run({"n": i}) for i in range(4)]  # over HTTP, with the endpoint's invocation key

    # Each handler holds its request until the gate opens: two requests in progress at once means two workers up
    # (concurrency 1), each on a host of its own (one GPU each).
    wait_for(lambda: echo.call("GET", "health")[1]["jobs"]["inProgress"] == 2, 90, "two workers to hold a request each")
    workers = workers_of(grid, "echo")
    assert len(workers) == 2 and len({a["agent_id"] for w in workers for a in w["assignments"]}) == 2, workers
    gate.touch()
    finished = [echo.ended(request_id, timeout=60) for request_id in submitted]
    tail = grid.master.tail() if grid.master else ""
    assert [(s["status"], s["attempt"], s["output"]) for s in finished] == [
        ("COMPLETED", 1, {"echo": {"n": i}}) for i in range(4)
    ], tail
    assert [w["id"] for w in workers_of(grid, "echo")] == [w["id"] for w in workers]  # no more than max_workers
    status, health = echo.call("GET", "health")
    assert status == 200 and health["jobs"] == {
        "inQueue": 0, "inProgress": 0, "completed": 4, "failed": 0, "cancelled": 0, "timedOut": 0,
    }, health  # fmt: skip

    shown = wait_for(
        lambda: (e := grid.get(f"/api/v1/endpoints/{echo.id}"))["scale"] and not sum(e["scale"]["workers"].values()) and e,
        60,
        "the workers to go back to zero after the idle timeout",
    )
    assert shown["scale"]["workers"] == {"starting": 0, "ready": 0}
    ended = [grid.get(f"/api/v1/workloads/{w['id']}") for w in workers]
    assert {w["state"] for w in ended} == {"cancelled"}, ended
    assert [(s["status"], s["output"]) for s in map(echo.status, submitted)] == [
        ("COMPLETED", {"echo": {"n": i}}) for i in range(4)
    ]  # unchanged by the workers' stop


def test_a_worker_sigkilled_mid_request_is_replaced_and_the_request_completes_once_on_the_new_one(scaling_grid):
    grid = scaling_grid
    for n in range(2):
        grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED)
    blocking = autoscaled(grid, "blocking", BLOCKING_HANDLER, scaling={"max_workers": 1, "concurrency": 1}, max_retries=2)
    request_id = blocking.run({"block": True})

    # Attempt 1 runs, and says where: the test finds its worker's process on its host and SIGKILLs it.
    me = wait_for(lambda: (blocking.status(request_id).get("progress") or {}).get("me"), 90, "the request to start")
    [first] = workers_of(grid, "blocking")
    pid = host_pid(me)
    assert pid, f"no process on this machine is the worker that said {me!r}"
    os.kill(pid, 9)
    wait_for(lambda: not pid_alive(pid), 10, "the worker's process to end")

    # Its agent sees the container end and tells the Master: the request goes back to the queue as attempt 2, the
    # autoscaler replaces the worker (a new workload), and the new worker completes it.
    done = blocking.ended(request_id, timeout=90)
    assert (done["status"], done["attempt"], done["output"]) == (
        "COMPLETED", 2, {"echo": {"block": True}, "attempt": 2, "seen_cancelled": []},
    ), done  # fmt: skip
    workers = workers_of(grid, "blocking")
    assert [w["id"] for w in workers][0] == first["id"] and len(workers) == 2, workers
    assert grid.get(f"/api/v1/workloads/{first['id']}")["state"] == "failed"  # its command was killed
    replacement = workers[1]["id"]  # (its workload may show running a moment after its worker's first call)
    wait_for(lambda: grid.get(f"/api/v1/workloads/{replacement}")["state"] == "running", 30, "the replacement to run")
    status, health = blocking.call("GET", "health")
    assert status == 200 and health["jobs"]["completed"] == 1 and health["jobs"]["inProgress"] == 0, health
    assert blocking.status(request_id) | {"delayTime": 0, "executionTime": 0} == done | {"delayTime": 0, "executionTime": 0}


def test_a_host_sigkilled_mid_request_loses_its_worker_and_the_request_completes_once_on_the_other_host(scaling_grid):
    """The agent itself SIGKILLed (its process group): no worker ``gone`` reaches the Master, whose host-loss rules
    must send the request back. The worker's own process lives on (process-runtime containers outlive their agent),
    cut off from the Master with its request, which it can never report on."""
    grid = scaling_grid
    daemons = dict(grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED) for n in range(2))
    blocking = autoscaled(grid, "blocking", BLOCKING_HANDLER, scaling={"max_workers": 1, "concurrency": 1}, max_retries=2)
    request_id = blocking.run({"block": True})
    me = wait_for(lambda: (blocking.status(request_id).get("progress") or {}).get("me"), 90, "the request to start")
    [first] = workers_of(grid, "blocking")
    [lost] = {a["agent_id"] for a in first["assignments"]}
    [kept] = set(daemons) - {lost}
    daemons[lost].kill()

    done = blocking.ended(request_id, timeout=120)
    assert (done["status"], done["attempt"], done["output"]) == (
        "COMPLETED", 2, {"echo": {"block": True}, "attempt": 2, "seen_cancelled": []},
    ), done  # fmt: skip
    assert pid_alive(host_pid(me))  # attempt 1's process still runs on the lost host, its report never to come
    # The one worker left runs on the other host (its workload may show running a moment after its first call).
    wait_for(
        lambda: (
            [a["agent_id"] for w in workers_of(grid, "blocking") if w["state"] == "running" for a in w["assignments"]] == [kept]
        ),
        30,
        f"the one worker to run on {kept}",
    )
    status, health = blocking.call("GET", "health")
    assert status == 200 and health["jobs"]["completed"] == 1 and health["jobs"]["inProgress"] == 0, health


def test_a_cancel_reaches_its_running_worker_and_a_request_no_worker_can_take_expires_at_its_ttl(scaling_grid):
    grid = scaling_grid
    grid.run_agent("host-0", simulate="a10:1", env=SANDBOXED)
    blocking = autoscaled(grid, "blocking", BLOCKING_HANDLER, scaling={"max_workers": 1, "concurrency": 1})
    nowhere = autoscaled(grid, "nowhere", BLOCKING_HANDLER, scaling={"max_workers": 0}, ttl_s=3, execution_timeout_s=1)

    slow = blocking.run({"block": True})
    stranded = nowhere.run({"n": 1})
    wait_for(lambda: blocking.status(slow).get("progress"), 90, "the blocking request to start")
    status, cancelled = blocking.call("POST", f"cancel/{slow}")
    assert status == 200 and cancelled["status"] == "CANCELLED", cancelled
    # The worker learns it at its next heartbeat: its handler stops, and the worker (concurrency 1) takes the next
    # request, whose output lists the cancel its process saw.
    after = blocking.ended(blocking.run("after the cancel"), timeout=60)
    assert (after["status"], after["output"]) == (
        "COMPLETED", {"echo": "after the cancel", "attempt": 1, "seen_cancelled": [slow]},
    ), after  # fmt: skip
    assert blocking.status(slow)["status"] == "CANCELLED"  # its late result changed nothing
    assert len(workers_of(grid, "blocking")) == 1  # the same worker, not a replacement

    # max_workers 0: no worker ever starts, and the request ends at its TTL, saying so.
    expired = nowhere.ended(stranded, timeout=30)
    assert (expired["status"], expired["reason"]) == ("TIMED_OUT", "ttl"), expired
    assert workers_of(grid, "nowhere") == []
