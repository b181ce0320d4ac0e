"""The market on a real local grid: a Master (its scheduler and metering inside), a relay and sandboxed agents, each its
own process (tests/support/grid.py). Renters use the API with their own keys; money is checked in the ledger to the
micro-unit. Metering posts every second here (``metering_period_s`` 1) so a test sees several periods in seconds.

Prices: 3.60 per GPU-hour on demand = 0.001 per second, so a whole second is 1,000 micro-units and the exact charge of
a run is easy to state. GPUs are simulated (none exists here); faults are injected through simulated-faults.json.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent.fault_injection import FAULTS_FILE
from management.client.api import ApiClient
from tests.e2e.test_renter_access import cli
from tests.e2e.test_scheduler import RenterClient, renter, sandboxed_hosts, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for

PRICES = {"on_demand": "3.60", "min_bid": "0.36"}  # per GPU-hour: 0.001 and 0.0001 per second
MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "preemption_grace_s": 3.0,
    "offer_sandboxed_hosts": True,
    "telemetry_s": 0.5,
    "metering_period_s": 1.0,
    "platform_fee_percent": 10.0,
    "spend_cap_check_s": 0.5,
}
TRAP = "trap 'echo TERM >> {file}; exit 0' TERM; while :; do sleep 0.2; done"  # writes TERM when it gets SIGTERM


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def micro(amount: str) -> int:
    return int(Decimal(amount) * 1_000_000)


def priced_grid(grid: Grid, hosts: int) -> dict[str, Any]:
    found = sandboxed_hosts(grid, hosts)
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)
    return found


def funded_renter(grid: Grid, account: str, amount: str) -> RenterClient:
    client = renter(grid, account)
    grid.client.credit(account, amount, memo="test credit")
    return client


def statement(client: ApiClient, account: str) -> list[dict[str, Any]]:
    return list(client.ledger(account, limit=1000)["lines"])


def rentals_of(client: ApiClient, workload_id: str) -> list[dict[str, Any]]:
    return list(client.get("/api/v1/rentals", workload=workload_id, limit=100)["items"])


def seconds_run(rental: dict[str, Any]) -> int:
    from management.client.api import instant

    start, end = instant(rental["started_at"]), instant(rental["ended_at"])
    assert start is not None and end is not None, rental
    return int(end - start)


def wait_heard(grid: Grid, client: ApiClient, workload_id: str, seconds: float) -> None:
    """Wait until every host of the workload's rental has heartbeated ``seconds`` into it. Charges stop at a host's
    last heartbeat when that is earlier than the stop (docs/payments.md), and a loaded machine delays heartbeats (CI
    ran one 3.5 s and was heard 2 s into it): a test that counts the seconds a rental ran waits for them to be heard."""
    from management.client.api import instant

    [rental] = [r for r in rentals_of(client, workload_id) if not r["ended_at"]]
    start = instant(rental["started_at"])
    assert start is not None, rental

    def heard() -> bool:
        return all((instant(grid.agent(h["agent_id"])["last_seen"]) or 0.0) >= start + seconds for h in rental["hosts"])

    wait_for(heard, 20, f"the hosts of {workload_id} to be heard {seconds} s into its rental")


def books(grid: Grid, renters: list[str]) -> dict[str, int]:
    """Every ledger account's balance, as the API shows them: the renters' available and held money, the provider's
    net earnings, the operator's (the platform's fees and the money credited from outside, negative)."""
    balances: dict[str, int] = {}
    for account in renters:
        balance = grid.client.balance(account)
        balances[f"renter:{account}"] = micro(balance["available"])
        balances[f"hold:{account}"] = micro(balance["held"])
    earnings = grid.client.statement(TEST_PROVIDER, "earnings")["items"]
    balances[f"provider:{TEST_PROVIDER}"] = sum(micro(e["net"]) for e in earnings)
    operator = grid.client.ledger("operator", limit=1000)
    balances["platform"] = micro(operator["closing"])
    return balances


def test_a_renter_rents_an_offer_on_demand_runs_and_stops_and_the_ledger_shows_the_exact_charge(grid, drop):
    priced_grid(grid, 1)
    alice = funded_renter(grid, "alice", "10")
    [offer] = alice.search_offers("num_gpus>=1 price<=4")["offers"]
    assert (offer["price"], offer["min_bid"]) == ("3.60", "0.36")
    rented = alice.rent_offer(offer["id"], workload("od", "sleep 300"))
    assert rented["rental"]["kind"] == "on_demand" and rented["spec"]["rental"]["offer"] == offer["id"]
    running = wait_workload(alice, rented["id"], "runs", lambda w: w["state"] == "running")
    assert running["rental"]["summary"].startswith("on demand at 3.60 USD per GPU-hour (the host's listed price)")
    time.sleep(3.5)
    wait_heard(grid, alice, rented["id"], 3)
    alice.cancel_workload(rented["id"])
    [rental] = wait_for(lambda: [r for r in rentals_of(alice, rented["id"]) if r["ended_at"]] or None, 15, "the rental to end")
    seconds = seconds_run(rental)
    assert seconds >= 3
    expected = 3_600_000 * 1 * seconds // 3600  # price x GPUs x whole seconds
    wait_for(lambda: micro(rental_charge(alice, rental["id"])) == expected, 10, "the last period to be posted")
    assert micro(alice.balance("alice")["available"]) == 10_000_000 - expected
    assert micro(alice.balance("alice")["held"]) == 0  # the hold released at the end
    earnings = grid.client.statement(TEST_PROVIDER, "earnings")["items"]
    gross = sum(micro(e["gross"]) for e in earnings)
    fees = sum(micro(e["fee"]) for e in earnings)
    assert gross == expected and fees == expected // 10
    assert sum(micro(e["net"]) for e in earnings) == expected - fees
    balances = books(grid, ["alice"])
    assert sum(balances.values()) == 0, balances  # the platform's account holds the fees less the credit from outside


def rental_charge(client: ApiClient, rental_id: str) -> str:
    return str(client.get(f"/api/v1/rentals/{rental_id}")["charged"])


def test_an_interruptible_rental_is_preempted_by_an_on_demand_one_requeued_uncharged_and_resumes(grid, drop):
    [host] = priced_grid(grid, 1)
    alice = funded_renter(grid, "alice", "10")
    bob = funded_renter(grid, "bob", "10")
    # No restart_policy: a bid resumes by default (issue 37), as the README says.
    trap = workload("cheap", TRAP.format(file=drop / "cheap"), rental={"kind": "interruptible", "bid": "0.72"})
    cheap = alice.submit_workload(trap)
    assert cheap["spec"]["restart_policy"] == "on_failure", cheap["spec"]
    wait_workload(alice, cheap["id"], "runs", lambda w: w["state"] == "running")
    [offer] = bob.search_offers("num_gpus_on_demand>=1")["offers"]  # its GPU is held, by an interruptible rental
    assert (offer["id"], offer["num_gpus"], offer["num_gpus_on_demand"]) == (host, 0, 1)
    od = bob.rent_offer(host, workload("urgent", "sleep 300", rental={"kind": "on_demand", "max_price": "5"}))
    wait_workload(bob, od["id"], "runs", lambda w: w["state"] == "running", timeout=30)
    assert (drop / "cheap").read_text().split() == ["TERM"], "the interruptible container saw no SIGTERM"
    waiting = alice.workload(cheap["id"])
    assert waiting["state"] == "queued" and waiting["preemptions"] == 1, waiting
    assert "interruptible at your bid of 0.72" in waiting["rental"]["summary"]
    [first] = rentals_of(alice, cheap["id"])
    assert first["ended_at"] is not None and first["hosts"][0]["price"] == "0.72"
    charged = alice.balance("alice")
    time.sleep(2.5)  # queued: nothing is charged while it waits
    assert alice.balance("alice") == charged
    assert bob.workload(od["id"])["assignments"][0]["agent_id"] == host
    bob.cancel_workload(od["id"])
    wait_workload(alice, cheap["id"], "runs again", lambda w: w["state"] == "running", timeout=30)
    again = [f"{cheap['id']}-a1", f"{cheap['id']}-a2"]  # a new rental at its bid; the first stays ended
    wait_for(lambda: [r["id"] for r in rentals_of(alice, cheap["id"])] == again, 5, "the second rental to open")


def test_a_renter_at_zero_balance_has_its_work_stopped_and_is_charged_nothing_after(grid, drop):
    """The money running out stops the work as a preemption does: SIGTERM (the trap writes TERM), the grace, then
    SIGKILL; its provider is paid every second it ran, and nothing is charged after. What the job printed, its last
    words in the grace too, is kept and readable after its container is gone."""
    priced_grid(grid, 1)
    carol = funded_renter(grid, "carol", "0.003")  # three seconds at 3.60 per hour
    command = "echo working; " + TRAP.format(file=drop / "short").replace("exit 0", "echo cleaning-up; exit 0")
    started = carol.submit_workload(workload("short", command))
    done = wait_workload(carol, started["id"], "stopped", lambda w: w["state"] == "failed", timeout=30)
    assert "balance ran out" in done["state_reason"], done
    wait_for(lambda: (drop / "short").exists(), 10, "the container to see its SIGTERM")
    assert (drop / "short").read_text().split() == ["TERM"], "the container saw no SIGTERM"
    balance = carol.balance("carol")
    [rental] = rentals_of(carol, started["id"])
    assert balance["held"] == "0.00"  # what the hold kept beyond the run returned
    # Stopped while the hold still paid for it (docs/payments.md, "Holds"): every second it ran is paid, no more, up
    # to what the renter had: three seconds of money is less than the two meter ticks a hold stops work before, so on
    # a loaded machine the stop (SIGTERM, its grace) can outlast the money (CI saw 4 s run, 3 s paid).
    assert micro(rental["charged"]) == min(3_600_000 * seconds_run(rental) // 3600, 3_000) > 0
    assert micro(rental["charged"]) + micro(balance["available"]) == 3_000
    entries = statement(carol, "carol")
    time.sleep(2.5)
    assert statement(carol, "carol") == entries, "charged after the work was stopped"
    kept = wait_workload(carol, started["id"], "its output kept", lambda w: [o["state"] for o in w["outputs"]] == ["kept"])
    assert [a["state"] for a in kept["assignments"]] == ["deleted"]
    read = cli(grid, carol.api_key, "workload", "logs", started["id"], "--tail", "-1")
    lines = read.stdout.splitlines()  # the shell may say "Terminated" of the sleep its SIGTERM ended
    assert (read.returncode, lines[0], lines[-1]) == (0, "working", "cleaning-up"), read


def test_a_master_killed_during_metering_charges_no_period_twice_and_loses_at_most_one(grid, drop):
    priced_grid(grid, 1)
    dave = funded_renter(grid, "dave", "10")
    job = dave.submit_workload(workload("long", "sleep 300"))
    wait_workload(dave, job["id"], "runs", lambda w: w["state"] == "running")
    time.sleep(2.5)
    grid.master.kill(signal.SIGKILL)
    time.sleep(1.5)
    grid.restart_master()
    dave = RenterClient(grid.api_url, dave.api_key)
    time.sleep(2.5)
    dave.cancel_workload(job["id"])
    [rental] = wait_for(lambda: [r for r in rentals_of(dave, job["id"]) if r["ended_at"]] or None, 20, "the rental to end")
    keys = [line["key"] for line in statement(dave, "dave")]
    assert len(keys) == len(set(keys)), "an entry posted twice"
    full = 3_600_000 * seconds_run(rental) // 3600
    charged = micro(rental["charged"])
    assert full - 1_000 * MASTER_SETTINGS["metering_period_s"] <= charged <= full, (charged, full)  # type: ignore[operator]
    assert sum(books(grid, ["dave"]).values()) == 0


def test_a_host_that_fails_a_rental_refunds_the_renter_and_its_reputation_says_why(grid, drop):
    hosts = priced_grid(grid, 2)
    erin = funded_renter(grid, "erin", "10")
    job = erin.submit_workload(workload("faulty", "sleep 300", restart_policy="on_failure"))
    first = wait_workload(erin, job["id"], "runs", lambda w: w["state"] == "running")
    [placed] = first["assignments"]
    host = hosts[placed["agent_id"]]
    time.sleep(2.5)
    score_before = grid.agent(placed["agent_id"])["reputation"]["score"]
    faults = grid.root / "agents" / host.name / FAULTS_FILE
    faults.write_text(json.dumps({host.gpu: {"xid": 79}}))
    wait_for(
        lambda: erin.workload(job["id"])["attempts"] == 2 and erin.workload(job["id"])["state"] == "running",
        30,
        "the workload to run again on the healthy host",
    )
    failed, _ = wait_for(lambda: (r := rentals_of(erin, job["id"])) and len(r) == 2 and r, 5, "the second rental")
    assert failed["host_failure"] and placed["agent_id"] in failed["host_failure"], failed
    assert micro(failed["charged"]) == 0, "the renter paid for a run its host failed"
    refunds = [line for line in statement(erin, "erin") if line["kind"] == "refund"]
    assert refunds and placed["agent_id"] in refunds[0]["memo"], refunds
    events = grid.get(f"/api/v1/events?subject={placed['agent_id']}&kind=agent.reputation&limit=10")["items"]
    assert any(e["data"]["component"] == "rentals" and e["data"]["reason"] for e in events), events
    assert grid.agent(placed["agent_id"])["reputation"]["score"] < score_before


def test_a_hard_spend_cap_stops_running_work_with_its_grace_and_no_new_work_starts_until_it_allows(grid, drop):
    """Issue 40: a hard hourly cap of 0.003 (three seconds here) reached while the job runs: the job gets SIGTERM and
    its grace (it checkpoints there), goes back to the queue, nothing of it or of the balance is destroyed, it does not
    start again while the cap holds (its wait names the cap), and it runs again once the cap is raised."""
    priced_grid(grid, 1)
    erin = funded_renter(grid, "erin", "10")
    capped = erin.set_spend_caps([{"window": "hour", "limit": "0.003", "hard": True}])
    assert capped["caps"][0]["hard"] is True and capped["caps"][0]["limit"] == "0.003"
    job = erin.submit_workload(workload("capped", TRAP.format(file=drop / "capped")))
    wait_workload(erin, job["id"], "runs", lambda w: w["state"] == "running")
    stopped = wait_workload(
        erin, job["id"], "stopped by its cap", lambda w: w["state"] in ("queued", "scheduled") and "cap" in w["state_reason"],
        timeout=30,
    )  # fmt: skip
    assert "hard cap of 0.003 USD per hour on the account is reached" in stopped["state_reason"], stopped
    wait_for(lambda: (drop / "capped").exists(), 10, "the container to see its SIGTERM")
    assert (drop / "capped").read_text().split() == ["TERM"], "the container saw no SIGTERM (no grace to checkpoint in)"
    [rental] = wait_for(lambda: [r for r in rentals_of(erin, job["id"]) if r["ended_at"]] or None, 10, "the rental to end")
    charged = micro(rental["charged"])
    assert charged == 3_600_000 * seconds_run(rental) // 3600 >= 3_000
    time.sleep(2.5)  # the cap holds: the job waits, nothing more is charged, no second rental
    waiting = erin.workload(job["id"])
    assert waiting["state"] == "queued", waiting
    assert "hard cap" in json.dumps(erin.explain_workload(job["id"]))
    assert [r["id"] for r in rentals_of(erin, job["id"])] == [rental["id"]]
    balance = erin.balance("erin")
    assert micro(balance["available"]) + micro(balance["held"]) == 10_000_000 - charged  # nothing else taken
    settings = erin.billing_settings()
    assert settings["caps"][0]["reached"] is True and micro(settings["caps"][0]["spent"]) >= 3_000
    events = grid.client.get("/api/v1/events", kind="payments.spend_cap", subject="erin")["items"]
    assert [e["data"]["hard"] for e in events] == [True]  # told once, not at every reading

    erin.set_spend_caps([{"window": "hour", "limit": "100", "hard": True}])  # raised: the job starts again
    wait_workload(erin, job["id"], "runs again", lambda w: w["state"] == "running", timeout=30)
    erin.cancel_workload(job["id"])
    assert sum(books(grid, ["erin"]).values()) == 0
