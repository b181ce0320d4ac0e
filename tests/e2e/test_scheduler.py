"""Acceptance 2: the scheduler on a real local grid. A Master (its scheduling loop inside), a relay and agents, each
its own process (tests/support/grid.py); renters use the API with their own keys, as they would.

Hosts run the process runtime sandboxed: the agent runs as root and starts each container as a uid of its own in a PID
namespace of its own (isolation ``sandbox``), and the Master offers such hosts because ``offer_sandboxed_hosts`` is
set and the workloads allow the process runtime. It starts a container in milliseconds, needs nothing but
util-linux, and its containers are host processes whose pids the test can watch. (The Docker runtime through
Podman is the other isolating choice; it needs a Podman service and an imported image first, and more moving parts.)
The GPUs are simulated (none exists here); a fault is injected through the agent's simulated-faults.json.

Containers run as uids of their own, which cannot enter pytest's private directories, and get private /tmp, so they
report to a drop directory outside both: each appends ``<pid> <PID namespace> <CUDA_VISIBLE_DEVICES>`` (its GPU) to
a file named after the workload; the test finds its host pid from the namespace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agent.fault_injection import FAULTS_FILE
from management.client.api import ApiClient, ApiRequest
from tests.support.grid import WHO_AM_I, Grid, host_pid, pid_alive, running_grid, wait_for

PERIOD_S = 1.0
GRACE_S = 3.0
MOVE_DEADLINE_S = 30.0
SANDBOXED = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}
MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": PERIOD_S,
    "preemption_grace_s": GRACE_S,
    "offer_sandboxed_hosts": True,
    "telemetry_s": 0.5,  # the agents sample (and read simulated-faults.json) twice a second
}
# umask 0: replicas run as uids of their own and append to one file. "<pid> <start> <namespace>" as the container
# sees itself (tests.support.grid.WHO_AM_I), then its GPU.


def record_start(file: Path) -> str:
    return f'{WHO_AM_I}; umask 0; echo "$me $CUDA_VISIBLE_DEVICES" >> {file}'


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    """A Master that schedules every second, offers sandboxed hosts and gives preempted containers 3 s; one relay."""
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


class Sandboxed(NamedTuple):
    name: str  # the agent's name in the grid (its state directory)
    gpu: str  # the uuid of its one GPU


def sandboxed_hosts(grid: Grid, count: int) -> dict[str, Sandboxed]:
    """``count`` hosts with one simulated A10 each, by host id."""
    hosts = {}
    for n in range(count):
        agent_id, _ = grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED)
        agent = grid.agent(agent_id)
        assert (agent["runtime"], agent["isolation"]) == ("process", "sandbox"), agent
        [gpu] = [g["uuid"] for g in agent["gpus"]]
        hosts[agent_id] = Sandboxed(f"host-{n}", gpu)
    return hosts


class RenterClient(ApiClient):
    """A renter's client: it always holds a key (the CLI is handed it too)."""

    api_key: str


def renter(grid: Grid, account: str) -> RenterClient:
    """A renter account and a key of its own, made through the API by the operator."""
    grid.client.create_account(account, "renter")
    return RenterClient(grid.api_url, grid.client.create_api_key(account, "e2e")["key"])


def workload(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "none",  # the process runtime runs the command on the host
        "command": ["sh", "-c", command],
        "replica": {"gpus": 1},
        "constraints": {"allow_process_runtime": True},
        **fields,
    }


def recorded(drop: Path, name: str) -> list[list[str]]:
    """(pid in its namespace, start time, namespace, GPU uuid) of every start of a container of workload ``name``."""
    path = drop / name
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def starts(drop: Path, name: str) -> list[tuple[int, str]]:
    """(host pid, or 0 once it has ended, GPU uuid) of every start of a container of workload ``name``, oldest first."""
    return [(host_pid(" ".join(fields[:3])), fields[3]) for fields in recorded(drop, name)]


def live_starts(drop: Path, name: str) -> dict[str, int]:
    """GPU uuid -> pid, for the containers of ``name`` whose process runs now."""
    return {gpu: pid for pid, gpu in starts(drop, name) if pid_alive(pid)}


def wait_workload(client: ApiClient, workload_id: str, what: str, predicate: Any, timeout: float = 20) -> dict[str, Any]:
    return wait_for(lambda: (w := client.workload(workload_id)) and predicate(w) and w, timeout, f"{workload_id} {what}")


def by_replica(rec: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {a["replica"]: a for a in rec["assignments"]}


def test_a_gang_runs_on_two_hosts_at_once_and_a_fatal_xid_moves_it_within_30_s(drop, grid):
    hosts = sandboxed_hosts(grid, 3)
    alice = renter(grid, "alice")
    gang = workload("gang", f"{record_start(drop / 'gang')}; exec sleep 600", replicas=2, network="none")

    submitted = alice.submit_workload(gang)
    assert submitted["account"] == "alice" and submitted["state"] == "queued"
    rec = wait_workload(alice, submitted["id"], "running", lambda w: w["state"] == "running")

    # Both replicas at once, on two different hosts, each on its host's GPU; both processes alive together.
    replicas = by_replica(rec)
    assert sorted(replicas) == [0, 1]
    assert replicas[0]["agent_id"] != replicas[1]["agent_id"]
    for a in replicas.values():
        assert a["units"] == [hosts[a["agent_id"]].gpu]
        assert a["container"] in grid.agent(a["agent_id"])["containers"]
    live = wait_for(lambda: len(s := live_starts(drop, "gang")) == 2 and s, 10, "both replicas to record their start")
    assert set(live) == {a["units"][0] for a in replicas.values()}
    assert all(pid_alive(pid) for pid in live.values())

    # A fatal Xid on replica 0's GPU: the gang is running again, replica 0 elsewhere, within 30 s.
    broken_host, broken = replicas[0]["agent_id"], replicas[0]["units"][0]
    (spare,) = set(hosts) - {a["agent_id"] for a in replicas.values()}
    faults = grid.agent_dir(hosts[broken_host].name) / FAULTS_FILE
    injected = time.monotonic()
    faults.write_text(json.dumps({broken: {"xid": 79}}))

    def moved(w: dict[str, Any]) -> bool:
        return w["state"] == "running" and w["attempts"] == 2 and broken_host not in {a["agent_id"] for a in w["assignments"]}

    rec = wait_workload(alice, submitted["id"], "running again off the faulty GPU", moved, timeout=MOVE_DEADLINE_S)
    took = time.monotonic() - injected
    print(f"\nfatal Xid on {broken} -> gang running again on {sorted(a['agent_id'] for a in rec['assignments'])} in {took:.1f} s")
    assert took < MOVE_DEADLINE_S  # the wait's own deadline: the gang is moved at all, not how fast (bench's)
    assert sorted(a["agent_id"] for a in rec["assignments"]) == sorted(set(hosts) - {broken_host})
    assert spare in {a["agent_id"] for a in rec["assignments"]}
    moves = [e["data"] for e in grid.get(f"/api/v1/events?subject={submitted['id']}&kind=workload.transition")["items"]]
    assert any(m["event"] == "requeue" and broken in m["reason"] for m in moves), moves

    # The new containers run; the old ones are gone; the faulty GPU got nothing new.
    live = wait_for(lambda: len(s := live_starts(drop, "gang")) == 2 and s, 10, "both new replicas to record their start")
    assert set(live) == {a["units"][0] for a in rec["assignments"]}
    assert len(starts(drop, "gang")) == 4
    gpu = next(g for g in grid.agent(broken_host)["gpus"] if g["uuid"] == broken)
    assert gpu["state"] == "faulty" and gpu["fault"]["kind"] == "xid"
    assert grid.agent(broken_host)["containers"] == []
    creates = [c for c in grid.client.list("/api/v1/commands", agent_id=broken_host) if c["kind"] == "create_container"]
    assert [c["spec"]["name"] for c in creates] == [replicas[0]["container"]]  # the first attempt's, nothing since

    # One more GPU asked for: the only one not held is the faulty one, so it waits, and says the fault is why.
    probe = alice.submit_workload(workload("probe", "exec sleep 600"))
    why = alice.send(ApiRequest("GET", f"/api/v1/workloads/{probe['id']}/explain"))
    assert why["fits_now"] is False, why
    assert any("unhealthy" in f["name"] and f["removed"] == 1 for f in why["filters"]), why
    assert alice.workload(probe["id"])["assignments"] == []


def test_a_high_workload_preempts_a_low_one_whose_container_sees_sigterm_first(drop, grid):
    ((host, (_, gpu)),) = sandboxed_hosts(grid, 1).items()
    bob, carol = renter(grid, "bob"), renter(grid, "carol")
    # The victim never stops on its own. On SIGTERM it writes its pid to a marker, takes a second to clean up (within
    # the grace; SIGKILL would cut it short), notes that it finished, and exits.
    marker = drop / "low-saw-sigterm"
    on_term = f"trap 'echo $me | tr \" \" _ > {marker}; sleep 1; echo cleaned-up >> {marker}; exit 0' TERM"
    low_command = f"{on_term}; {record_start(drop / 'low')}; while :; do sleep 0.1; done"
    low = bob.submit_workload(workload("low", low_command, priority="low", restart_policy="on_failure"))
    wait_workload(bob, low["id"], "running", lambda w: w["state"] == "running")
    ((victim_pid, victim_gpu),) = wait_for(lambda: starts(drop, "low"), 10, "the low workload's container to start")
    assert victim_gpu == gpu and pid_alive(victim_pid)

    high = carol.submit_workload(workload("high", f"{record_start(drop / 'high')}; exec sleep 600", priority="high"))
    rec = wait_workload(carol, high["id"], "running", lambda w: w["state"] == "running", timeout=GRACE_S + 15)

    assert [(a["agent_id"], a["units"]) for a in rec["assignments"]] == [(host, [gpu])]
    victim = "_".join(recorded(drop, "low")[0][:3])
    assert marker.read_text().split() == [victim, "cleaned-up"]  # SIGTERM first, then the whole grace
    assert not pid_alive(victim_pid)
    ((high_pid, high_gpu),) = wait_for(lambda: starts(drop, "high"), 10, "the high workload's container to start")
    assert high_gpu == gpu and pid_alive(high_pid)
    assert marker.stat().st_mtime_ns <= (drop / "high").stat().st_mtime_ns  # the victim was done before it started
    victim = bob.workload(low["id"])
    assert victim["preemptions"] == 1 and victim["state"] == "queued", victim  # on_failure: back in the queue
    moves = [e["data"] for e in grid.get(f"/api/v1/events?subject={low['id']}&kind=workload.transition")["items"]]
    assert {"preempt", "requeue"} <= {m["event"] for m in moves}, moves
    assert len(starts(drop, "low")) == 1  # it waits; nothing else could hold it

    # The high one is cancelled: the victim, waiting in the queue, gets the GPU back.
    assert carol.cancel_workload(high["id"])["state"] == "cancelled"
    again = wait_workload(bob, low["id"], "running again", lambda w: w["state"] == "running", timeout=GRACE_S + 15)
    assert again["attempts"] == 2 and [a["units"] for a in again["assignments"]] == [[gpu]]
    assert not pid_alive(high_pid)
    (_, (second_pid, _)) = wait_for(lambda: len(s := starts(drop, "low")) == 2 and s, 10, "the victim to start again")
    assert pid_alive(second_pid)
