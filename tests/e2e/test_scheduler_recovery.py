"""Acceptance 4, the scheduler across a Master SIGKILL: with workloads starting and running when the Master dies, the
restarted Master loses none, adopts the containers that run (none is started twice), finishes the starts that were
under way, and no GPU ever has two holders.

Real processes throughout (Master, relay, agents, and each workload's container a sandboxed process run as
a uid of its own by the process runtime); only the GPUs are simulated. The race is made deterministic by freezing one
host (SIGSTOP) before the last workloads are placed: the Master has stored their placement and sent their creates,
which wait in that host's socket, so at the kill one workload is ``scheduled`` (create sent, never acknowledged) and
the gang is ``starting`` (one replica runs on the other host, the other's create waits). The frozen host then runs
those creates while the Master is down, so their results reach the restarted Master from the relay's buffer.

Each container appends ``<its pid> <its start time> <its PID namespace> <its CUDA_VISIBLE_DEVICES>`` to
``runs/<container name>`` when it starts: the number of lines is the number of times it started, and the GPUs are
what the host gave it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.grid import QUICK_RECONNECT, WHO_AM_I, Daemon, Grid, host_pid, pid_alive, wait_for, write_toml

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime sandboxes a container (a uid of its own) only as root"),
]

OFFLINE_GRACE_S = 12  # a host unseen this long has its workloads requeued
MASTER_ENV = {
    "IDLEGRID_MASTER_OFFER_SANDBOXED_HOSTS": "true",  # the process runtime's sandboxed hosts take workloads
    "IDLEGRID_MASTER_SCHEDULER_PERIOD_S": "1",
    # (Heartbeats come every second: a host is offline after 3 s of silence.)
    "IDLEGRID_MASTER_REQUEUE_OFFLINE_AFTER_S": str(OFFLINE_GRACE_S),
}
# A cycle runs at least every second: after this long, a container about to be started a second time would have been.
SETTLE_S = 3.0


@pytest.fixture
def root() -> Iterator[Path]:
    """The grid's root, outside pytest's private temporary directory and /tmp (private in each sandboxed container),
    so a container running as a uid of its own can reach its working directory under it (0711: passable, not
    listable) and write its start record (``runs/``)."""
    path = Path(tempfile.mkdtemp(prefix="idlegrid-recovery-", dir="/run"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def grid(root: Path) -> Iterator[Grid]:
    g = Grid(root)
    try:
        g.start_master(env=MASTER_ENV)
        g.start_relay("relay-1", "eu-west", extra=["--config", str(write_toml(root / "relay.toml", QUICK_RECONNECT))])
        yield g
    finally:
        for daemon in g.daemons:
            if daemon.alive():
                os.kill(daemon.pid, signal.SIGCONT)  # a host frozen by a failed test must be able to stop
        g.stop()


@pytest.fixture
def runs(root: Path) -> Path:
    path = root / "runs"
    path.mkdir()
    path.chmod(0o777)  # written by the containers, which run as uids of their own
    return path


def sandboxed_host(grid: Grid, name: str, simulate: str) -> tuple[str, Daemon]:
    """A host whose process runtime runs each container as a uid of its own (isolation ``sandbox``), ready."""
    agent_id, daemon = grid.run_agent(name, simulate=simulate, env={"IDLEGRID_AGENT_PROCESS_USER": "dynamic"})
    assert grid.agent(agent_id)["isolation"] == "sandbox"
    return agent_id, daemon


def recorded_start(runs: Path) -> list[str]:
    """The command of every workload here: record this start, then run until deleted."""
    record = f'{WHO_AM_I}; echo "$me $CUDA_VISIBLE_DEVICES" >> {runs}/"$IDLEGRID_CONTAINER"'
    return ["sh", "-c", f"{record}; sleep 600"]


def submit(grid: Grid, runs: Path, name: str, model: str, *, replicas: int = 1) -> str:
    """A workload of ``replicas`` × one GPU of ``model`` (which decides the hosts it can go to), for renter alice."""
    body = {
        "account": "alice",
        "name": name,
        "image": "none",
        "command": recorded_start(runs),
        "replicas": replicas,
        "network": "none",  # a gang whose replicas need not reach each other: this grid runs no lighthouse
        "replica": {"gpus": 1, "models": [model]},
        "constraints": {"allow_process_runtime": True},
    }
    status, answer = grid.call("POST", "/api/v1/workloads", body)
    assert status == 201, answer
    return str(answer["id"])


def workload(grid: Grid, workload_id: str) -> dict[str, Any]:
    return dict(grid.get(f"/api/v1/workloads/{workload_id}"))


def wait_workload(grid: Grid, workload_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(
        lambda: (w := workload(grid, workload_id))["state"] == state and w,
        timeout,
        f"{workload_id} to be {state} (it is {workload(grid, workload_id)['state']})",
    )


def starts(runs: Path, container: str) -> list[tuple[int, str]]:
    """(host pid, 0 once ended; CUDA_VISIBLE_DEVICES) of each start of ``container`` (it records its pid in its own
    PID namespace, and that namespace)."""
    path = runs / container
    lines = path.read_text().splitlines() if path.exists() else []
    return [(host_pid(line), line.split()[3]) for line in lines]


def states_in_store(grid: Grid, ids: list[str]) -> dict[str, str]:
    """Each workload's state as the store held it when the Master died (read from its SQLite file, the Master down)."""
    with contextlib.closing(sqlite3.connect(grid.master_dir / "master.db")) as db:
        marks = ",".join("?" * len(ids))
        return dict(db.execute(f"SELECT id, state FROM workloads WHERE id IN ({marks})", ids).fetchall())


def test_a_master_killed_while_workloads_start_and_run_loses_none_and_starts_none_twice(grid, runs):
    steady_id, _steady = sandboxed_host(grid, "steady", "l4:2,h100:1")
    frozen_id, frozen = sandboxed_host(grid, "frozen", "a10:1,h100:1")
    running = [submit(grid, runs, f"steady-{n}", "l4") for n in range(2)]
    for workload_id in running:
        wait_workload(grid, workload_id, "running")

    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        late = submit(grid, runs, "late", "a10")  # only the frozen host has an A10
        gang = submit(grid, runs, "gang", "h100-sxm", replicas=2)  # one H100 on each host: a replica on each
        wait_for(lambda: all(a["command_id"] for a in workload(grid, late)["assignments"]), 10, "the late create to be sent")
        wait_workload(grid, gang, "starting", timeout=10)
        grid.master.kill(signal.SIGKILL)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    everything = [*running, late, gang]
    at_kill = states_in_store(grid, everything)
    assert at_kill == {running[0]: "running", running[1]: "running", late: "scheduled", gang: "starting"}

    # The frozen host runs the creates it held while the Master is down: their results wait on the relay.
    waiting = [f"{late}-r0-a1", f"{gang}-r1-a1"]
    wait_for(lambda: all(starts(runs, c) for c in waiting), 15, f"the frozen host's creates to run\n{frozen.tail()}")
    grid.restart_master()

    final = {w: wait_workload(grid, w, "running") for w in everything}
    time.sleep(SETTLE_S)  # room for a wrong second start, or a requeue, to happen before it is looked for
    final = {w: workload(grid, w) for w in everything}

    # None lost, each placed once: the first attempt's containers run, adopted or finished starting, not restarted.
    listed = {w["id"]: w for w in grid.get("/api/v1/workloads?limit=100")["items"]}
    assert {w: listed[w]["state"] for w in everything} == dict.fromkeys(everything, "running")
    assert {w: (rec["attempts"], rec["restarts"]) for w, rec in final.items()} == dict.fromkeys(everything, (1, 0))
    for workload_id in everything:
        moves = grid.get(f"/api/v1/events?subject={workload_id}&kind=workload.transition&limit=100")["items"]
        assert sorted(e["data"]["event"] for e in moves) == sorted(["submit", "schedule", "start", "run"]), moves

    assignments = [(w, a) for w, rec in final.items() for a in rec["assignments"]]
    hosts = {w: sorted(a["agent_id"] for a in rec["assignments"]) for w, rec in final.items()}
    assert hosts == {running[0]: [steady_id], running[1]: [steady_id], late: [frozen_id], gang: sorted([steady_id, frozen_id])}
    containers = {a["container"] for _, a in assignments}
    assert {path.name for path in runs.iterdir()} == containers  # no other container was ever started
    for _, a in assignments:
        (pid, gpus), *again = starts(runs, a["container"])
        assert again == [], f"{a['container']} started {1 + len(again)} times"
        assert pid_alive(pid), f"{a['container']} (pid {pid}) no longer runs"
        assert gpus.split(",") == a["units"]  # what the host gave the container is what the workload was assigned

    # No GPU has two holders: no uuid in two live containers, ...
    held = [u for _, a in assignments for u in a["units"]]
    assert len(held) == len(set(held)) == 5
    # ... each host runs exactly its workloads' containers, and every GPU shows busy, ...
    for agent_id in (steady_id, frozen_id):
        mine = sorted(a["container"] for _, a in assignments if a["agent_id"] == agent_id)
        assert grid.agent(agent_id)["containers"] == mine
    gpus = grid.get("/api/v1/gpus?limit=100")["items"]
    assert sorted(g["uuid"] for g in gpus) == sorted(held)
    assert {g["uuid"]: g["state"] for g in gpus} == dict.fromkeys(held, "busy")
    # ... and the Master's allocation ledger names, for each GPU, exactly the container its workload was assigned:
    # another container asking for the GPU is refused, naming that holder (nothing is created).
    for _, a in assignments:
        for uuid in a["units"]:
            probe = {"name": "probe", "image": "none", "command": ["true"], "gpus": [uuid]}
            command = {"agent_id": a["agent_id"], "kind": "create_container", "spec": probe}
            status, answer = grid.call("POST", "/api/v1/commands", command)
            assert status == 409, answer
            assert f"held by container {a['container']!r} on host {a['agent_id']}" in answer["error"]["message"], answer


def test_hosts_whose_relay_redials_late_after_a_master_restart_keep_their_running_workloads(grid, runs):
    """After an outage, a relay comes back on its own backoff: its hosts go offline one heartbeat timeout after the
    restart, with the ``last_seen`` the store holds, which is older than the outage. The Master's own silence does not
    count against them: they get the whole offline grace from its start, and their containers are adopted."""
    steady_id, _steady = sandboxed_host(grid, "steady", "l4:1")
    workload_id = submit(grid, runs, "steady", "l4")
    wait_workload(grid, workload_id, "running")
    relay = grid.relays["relay-1"].daemon
    assert relay is not None

    os.kill(relay.pid, signal.SIGSTOP)  # it cannot redial until let go
    try:
        grid.master.kill(signal.SIGKILL)
        time.sleep(OFFLINE_GRACE_S - 2)  # the outage: longer than the offline grace less the heartbeat timeout
        grid.restart_master()
        restarted = time.time()
        grid.wait_state(steady_id, "offline", timeout=10)
        # Its stored last_seen is older than the offline grace by now; the grace from the restart is not over.
        time.sleep(max(0.0, restarted + 6 - time.time()))
    finally:
        os.kill(relay.pid, signal.SIGCONT)
    grid.wait_state(steady_id, "busy", timeout=OFFLINE_GRACE_S - 6)
    time.sleep(SETTLE_S)

    rec = workload(grid, workload_id)
    assert (rec["state"], rec["attempts"], rec["restarts"]) == ("running", 1, 0), rec
    moves = grid.get(f"/api/v1/events?subject={workload_id}&kind=workload.transition&limit=100")["items"]
    assert sorted(e["data"]["event"] for e in moves) == sorted(["submit", "schedule", "start", "run"]), moves
    (a,) = rec["assignments"]
    (pid, gpus), *again = starts(runs, a["container"])
    assert again == [] and pid_alive(pid) and gpus.split(",") == a["units"]
