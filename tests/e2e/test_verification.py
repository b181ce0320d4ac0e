"""Measured verification on a real local grid: a Master, a relay and agents as processes (tests/support/grid.py), with
simulated GPUs (no GPU exists here: the simulator answers the Master's challenge with real arithmetic and takes the
time its card would, agent/benchmark/simulated.py). Each cheat is an agent setting (``simulate_bench``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.catalog import CALIBRATED
from management.client.api import ApiClient, ApiError, ApiRequest
from tests.e2e.test_renter_access import cli
from tests.e2e.test_scheduler import SANDBOXED
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for

MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "verify_simulated": True,  # challenge simulated GPUs on join, as real ones are
    "verify_loop_s": 0.5,
    "offer_sandboxed_hosts": True,
    "scheduler_period_s": 1.0,
}
PRICES = {"on_demand": "2.00"}


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def provider_client(grid: Grid) -> ApiClient:
    with contextlib.suppress(ApiError):  # the account may exist already
        grid.client.create_account(TEST_PROVIDER, "provider")
    return ApiClient(grid.api_url, grid.client.create_api_key(TEST_PROVIDER, "e2e")["key"])


def gpu_of(grid: Grid, agent_id: str) -> dict[str, Any]:
    [gpu] = grid.agent(agent_id)["gpus"]
    return gpu


def settled(grid: Grid, agent_id: str, runs: int = 1) -> dict[str, Any]:
    """The host's verification history once its GPU has ``runs`` finished runs."""

    def done() -> dict[str, Any] | None:
        history = grid.get(f"/api/v1/agents/{agent_id}/verifications")
        return history if len(history["gpus"][0]["runs"]) >= runs else None

    return wait_for(done, 30, f"{agent_id} to have {runs} verification run(s)")


def test_honest_and_cheating_hosts_are_told_apart_and_the_reasons_shown_to_operator_and_provider(grid: Grid) -> None:
    honest, _ = grid.run_agent("honest", simulate="h100:1", env=SANDBOXED)
    slow, _ = grid.run_agent("t4-as-h100", simulate="h100:1", env=SANDBOXED, simulate_bench="as:t4")
    late, _ = grid.run_agent("late", simulate="h100:1", env=SANDBOXED, simulate_bench="late")
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)

    # The honest host: its challenge passed. A simulated GPU is never shown as verified: it says "simulated".
    run = settled(grid, honest)["gpus"][0]["runs"][0]
    assert (run["status"], run["code"]) == ("verified", ""), run
    gpu = gpu_of(grid, honest)
    assert gpu["verification"]["label"] == "simulated" and gpu["tier"] == "flagship" and gpu["flags"] == []
    assert gpu["verification"]["figures"]["bf16_tflops"] == CALIBRATED["h100-sxm"].tensor_tflops

    # A T4 claiming to be an H100 computes too slowly: late, flagged, not offered (as an H100 or at all).
    run = settled(grid, slow)["gpus"][0]["runs"][0]
    assert (run["status"], run["code"]) == ("failed", "late"), run
    assert "slower than a NVIDIA H100 SXM computes it" in run["reason"]
    gpu = gpu_of(grid, slow)
    assert "verification_failed" in gpu["flags"] and gpu["tier"] is None
    assert gpu["verification"]["label"].endswith("failed: late")

    run = settled(grid, late)["gpus"][0]["runs"][0]
    assert (run["status"], run["code"]) == ("failed", "late"), run

    offers = wait_for(lambda: grid.client.search_offers("num_gpus>=1")["offers"] or None, 20, "an offer")
    offered_hosts = {o["id"] for o in offers}
    assert honest in offered_hosts and slow not in offered_hosts and late not in offered_hosts

    # The operator reads the reason on the command line; the provider sees it on its host view (API and CLI).
    shown = cli(grid, grid.operator_key, "host", "verifications", slow)
    assert shown.returncode == 0 and "failed: late" in shown.stdout and "slower than" in shown.stdout, shown
    provider = provider_client(grid)
    seen = provider.send(ApiRequest("GET", f"/api/v1/agents/{slow}/verifications"))
    assert seen["gpus"][0]["runs"][0]["code"] == "late"
    host = cli(grid, provider.api_key or "", "host", "show", slow)
    assert host.returncode == 0 and "failed: late" in host.stdout, host


def test_a_replayed_answer_fails_and_an_operator_can_ask_for_a_run(grid: Grid) -> None:
    replayer, _ = grid.run_agent("replayer", simulate="h100:1", env=SANDBOXED, simulate_bench="replay")
    first = settled(grid, replayer)["gpus"][0]["runs"][0]
    assert first["status"] == "verified", first  # the recorded run itself was honest
    asked = cli(grid, grid.operator_key, "host", "verify", replayer)  # the operator asks for a run now
    assert asked.returncode == 0 and "1 challenge(s) sent" in asked.stdout, asked
    latest = settled(grid, replayer, runs=2)["gpus"][0]["runs"][0]
    assert (latest["status"], latest["code"]) == ("failed", "replayed"), latest
    assert "verification_failed" in gpu_of(grid, replayer)["flags"]


def test_a_benchmark_never_runs_on_a_rented_gpu(grid: Grid) -> None:
    host, _ = grid.run_agent("rented", simulate="h100:1", env=SANDBOXED)
    settled(grid, host)
    container = grid.command(
        host, "create_container", {"name": "job", "image": "none", "command": ["sleep", "60"], "gpus": ["0"]}
    )
    assert grid.wait_command(container)["state"] == "succeeded"
    status, body = grid.call("POST", f"/api/v1/agents/{host}/verify", {})
    assert status == 409 and "held by a renter" in body["error"]["message"], (status, body)


def test_a_workload_placed_while_a_benchmark_runs_waits_for_it_then_runs(tmp_path: Path) -> None:
    """Acceptance 3: the run holds its GPU (shown reserved); the renter's workload waits in the queue, not preempting
    it, and is placed once the run ended. A simulated H100 takes 8 s here (``verify_sim_target_s``)."""
    from tests.e2e.test_scheduler import renter, wait_workload, workload

    slow_run = {**MASTER_SETTINGS, "verify_sim_target_s": 8.0}
    with running_grid(tmp_path, slow_run) as grid:
        host, _ = grid.run_agent("host", simulate="h100:1", env=SANDBOXED)
        wait_for(lambda: gpu_of(grid, host)["state"] == "reserved", 20, "the benchmark to hold the GPU")
        alice = renter(grid, "alice")
        submitted = alice.submit_workload(workload("job", "exec sleep 600"))
        time.sleep(1.5)  # a few scheduler periods while the run holds the GPU
        assert alice.workload(submitted["id"])["state"] == "queued"
        assert gpu_of(grid, host)["state"] == "reserved"  # the run was not preempted
        running = wait_workload(alice, submitted["id"], "runs", lambda w: w["state"] == "running", timeout=30)
        run = settled(grid, host)["gpus"][0]["runs"][0]
        assert run["status"] == "verified", run
        assert running["scheduled_at"] >= run["at"], (running, run)  # placed only after the run ended
