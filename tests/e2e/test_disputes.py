"""Disputes and SLA credits on a real local grid (a Master, a relay and sandboxed agents, each its own process): a host
SIGKILLed mid-run credits its renter the downtime by the published formula on top of the refund, from its provider's
earnings; a dispute of an ended rental is answered by the provider and resolved by the operator with a partial refund.
Money is checked to the micro-unit and the books stay at zero.

Prices: 36.00 per GPU-hour = 0.01 per second (10,000 micro-units). The SLA credit here is 10% of the downtime's cost
(``sla_credit_percent`` 10, ``sla_min_downtime_s`` 1): 1,000 micro-units per whole second down, less than what the
provider earned before, so the provider's balance does not cap it. The containers are process-runtime sandboxes (no
Podman); the one left running on the SIGKILLed host (its agent is gone) is killed by the test.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_market import books, micro, rentals_of, seconds_run, statement
from tests.e2e.test_scheduler import RenterClient, renter, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, WHO_AM_I, Grid, host_pid, running_grid, wait_for

PRICES = {"on_demand": "36", "min_bid": "3.6"}  # per GPU-hour: 0.01 per second
MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "preemption_grace_s": 2.0,
    "offer_sandboxed_hosts": True,
    "telemetry_s": 0.5,
    "metering_period_s": 1.0,
    "platform_fee_percent": 10.0,
    "requeue_offline_after_s": 2.0,  # a lost host's workloads go elsewhere 2 s after it goes offline
    "sla_credit_percent": 10,
    "sla_min_downtime_s": 1.0,
}
SANDBOXED = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def recording(drop: Path, name: str, **fields: Any) -> dict[str, Any]:
    """A workload whose every start appends who it is (host_pid finds it) to ``drop/name``, then sleeps."""
    return workload(name, f'{WHO_AM_I}; echo "$me" >> {drop / name}; sleep 300', **fields)


def kill_recorded(drop: Path, name: str) -> None:
    """SIGKILL every process a start of ``name`` left (a sandbox whose agent was SIGKILLed lives on)."""
    path = drop / name
    for line in path.read_text().splitlines() if path.exists() else []:
        pid = host_pid(line)
        if pid:
            os.kill(pid, signal.SIGKILL)


def earn(grid: Grid, client: RenterClient, drop: Path, seconds: float) -> dict[str, Any]:
    """A rental of ``client`` that runs ``seconds`` and is cancelled: its provider earns from it. Its rental, ended."""
    job = client.submit_workload(recording(drop, "earner"))
    wait_workload(client, job["id"], "runs", lambda w: w["state"] == "running", timeout=30)
    time.sleep(seconds)
    client.cancel_workload(job["id"])
    [ended] = wait_for(lambda: [r for r in rentals_of(client, job["id"]) if r["ended_at"]] or None, 15, "the rental to end")
    wait_for(lambda: micro(client.get(f"/api/v1/rentals/{ended['id']}")["charged"]) > 0, 10, "its charge")
    return dict(client.get(f"/api/v1/rentals/{ended['id']}"))


def provider_key(grid: Grid) -> RenterClient:
    return RenterClient(grid.api_url, grid.client.create_api_key(TEST_PROVIDER, "e2e")["key"])


def hosts(grid: Grid, count: int) -> dict[str, Any]:
    daemons = dict(grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED) for n in range(count))
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)
    return daemons


def test_a_host_sigkilled_mid_run_credits_its_renter_the_downtime_from_its_provider(grid, drop):
    daemons = hosts(grid, 2)
    gail = renter(grid, "gail")
    grid.client.credit("gail", "100", memo="test credit")
    try:
        earn(grid, gail, drop, 3.0)  # the provider's earlier earnings, which the credit is taken from
        job = gail.submit_workload(recording(drop, "lost", restart_policy="on_failure"))
        first = wait_workload(gail, job["id"], "runs", lambda w: w["state"] == "running", timeout=30)
        [placed] = first["assignments"]
        time.sleep(2.5)
        earned_before = sum(micro(e["net"]) for e in grid.client.statement(TEST_PROVIDER, "earnings")["items"])
        daemons[placed["agent_id"]].kill(signal.SIGKILL)  # no goodbye: the Master loses it
        wait_for(
            lambda: gail.workload(job["id"])["attempts"] == 2 and gail.workload(job["id"])["state"] == "running",
            60,
            "the workload to run again on the other host",
        )
        failed = wait_for(
            lambda: next((r for r in rentals_of(gail, job["id"]) if r["host_failure"] and r["ended_at"]), None),
            15,
            "the lost run's rental to end",
        )
        assert placed["agent_id"] in failed["host_failure"], failed
        lines = wait_for(
            lambda: [ln for ln in statement(gail, "gail") if ln["kind"] == "sla_credit"] or None, 15, "the SLA credit"
        )
        [credit] = lines
        assert credit["rental"] == failed["id"] and placed["agent_id"] in credit["memo"], credit
        down = int(re.search(r": (\d+) s down x 10%", credit["memo"]).group(1))  # type: ignore[union-attr]
        assert down >= 1
        assert micro(credit["amount"]) == 1_000 * down  # 0.01/s x 1 GPU x 10% of the whole seconds down
        refunds = [ln for ln in statement(gail, "gail") if ln["kind"] == "refund" and ln["rental"] == failed["id"]]
        assert refunds, "the lost run's charges were not refunded"
        assert micro(failed["charged"]) == 0  # the refund returned them; the credit is on top
        earned_after = sum(micro(e["net"]) for e in grid.client.statement(TEST_PROVIDER, "earnings")["items"])
        assert earned_after <= earned_before - micro(credit["amount"]) + micro(refunds[0]["amount"])
        assert sum(books(grid, ["gail"]).values()) == 0
        gail.cancel_workload(job["id"])
        wait_workload(gail, job["id"], "ends", lambda w: w["state"] == "cancelled", timeout=30)
    finally:
        kill_recorded(drop, "lost")
        kill_recorded(drop, "earner")


def test_a_dispute_is_answered_by_the_provider_and_resolved_with_a_partial_refund(grid, drop):
    hosts(grid, 1)
    hana = renter(grid, "hana")
    grid.client.credit("hana", "100", memo="test credit")
    provider = provider_key(grid)
    try:
        rental = earn(grid, hana, drop, 3.0)
        paid = micro(rental["charged"])
        dispute = hana.open_dispute(rental["id"], "the GPU was half as fast as its offer said")
        assert (dispute["state"], dispute["provider"], dispute["rental"]) == ("open", TEST_PROVIDER, rental["id"])
        held, fee = micro(dispute["held"]), micro(dispute["fee"])
        assert held + fee == paid and held > 0  # the provider's share is held, the fee stays the platform's
        assert [c["key"] for c in dispute["evidence"]["charges"]][0] == f"hold:{rental['id']}:0"
        assert dispute["evidence"]["seconds"] == seconds_run(rental) >= 1  # the meter's own seconds
        answered = provider.answer_dispute(dispute["id"], "it ran at the offered speed")
        assert answered["state"] == "answered"
        available = micro(hana.balance("hana")["available"])
        refund = held // 2
        resolved = grid.client.resolve_dispute(dispute["id"], "partial", amount=f"{refund / 1_000_000:.6f}", note="half")
        assert (resolved["state"], micro(resolved["refunded"]), micro(resolved["released"])) == (
            "resolved", refund, held - refund,
        )  # fmt: skip
        assert micro(hana.balance("hana")["available"]) == available + refund
        assert sum(books(grid, ["hana"]).values()) == 0
        kinds = [ln["kind"] for ln in statement(hana, "hana")]
        assert kinds[-1] == "dispute_resolve", kinds
    finally:
        kill_recorded(drop, "earner")
