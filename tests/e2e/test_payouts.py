"""Money out on a real local grid (a Master, a relay and a sandboxed agent, each its own process) paying its provider
through the fake of Stripe's Connect calls (tests/support/fake_connect.py, on 127.0.0.1 behind the Master's
``stripe_api_base``): the provider earns on a real rental, the payout run is interrupted by the Master's SIGKILL while
Stripe makes the transfer, and the run after the restart pays nothing twice; the reconciliation finds a planted
difference."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_market import MASTER_SETTINGS, funded_renter, micro, rentals_of
from tests.e2e.test_scheduler import sandboxed_hosts, wait_workload, workload
from tests.support.fake_connect import ThreadedFakeConnect, threaded_fake_connect
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for


@pytest.fixture
def fake() -> Iterator[ThreadedFakeConnect]:
    with threaded_fake_connect() as threaded:
        yield threaded


@pytest.fixture
def grid(tmp_path: Path, fake: ThreadedFakeConnect) -> Iterator[Grid]:
    settings: dict[str, Any] = {
        **MASTER_SETTINGS,
        "payment_provider": "stripe",
        "stripe_api_key": "sk_test_e2e",
        "stripe_webhook_secret": "whsec_e2e",
        "stripe_api_base": fake.fake.url,
        "payout_window_s": 0.0,  # no dispute window: what was earned a moment ago is payable
        "payout_min": "0.001",
    }
    with running_grid(tmp_path, settings) as g:
        yield g


def earned(grid: Grid, drop: Path) -> int:
    """The provider's earnings from a few seconds of a real rental, once the last period is posted."""
    sandboxed_hosts(grid, 1)
    grid.client.set_default_price({"on_demand": "360", "min_bid": "36"}, provider=TEST_PROVIDER)  # 0.10 a second
    alice = funded_renter(grid, "alice", "10")
    [offer] = alice.search_offers("num_gpus>=1")["offers"]
    rented = alice.rent_offer(offer["id"], workload("od", "sleep 300"))
    wait_workload(alice, rented["id"], "runs", lambda w: w["state"] == "running")
    time.sleep(2.5)
    alice.cancel_workload(rented["id"])
    wait_for(lambda: [r for r in rentals_of(alice, rented["id"]) if r["ended_at"]] or None, 15, "the rental to end")
    time.sleep(1.5)  # the end's entry
    earnings = grid.client.statement(TEST_PROVIDER, "earnings")["items"]
    net = sum(micro(e["net"]) for e in earnings)
    return net - net % 10_000  # what a transfer pays: whole cents


def connect(grid: Grid) -> None:
    made = grid.client.connect_payout_account(account=TEST_PROVIDER)
    with urllib.request.urlopen(made["onboarding_url"], timeout=10) as browser:  # the owner finishes the onboarding
        assert browser.status == 200
    assert grid.client.payout_account(account=TEST_PROVIDER)["payouts_enabled"]


def test_a_payout_run_killed_while_stripe_makes_the_transfer_and_run_again_pays_nothing_twice(grid, fake, drop):
    payable = earned(grid, drop)
    connect(grid)
    assert payable > 0
    release = fake.call(fake.fake.hold_answers)
    interrupted: list[BaseException] = []

    def run() -> None:
        try:
            grid.client.run_payouts()
        except BaseException as exc:  # the Master dies under the request
            interrupted.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(lambda: len(fake.fake.transfers) == 1, 15, "Stripe to make the transfer")
    assert grid.master is not None
    grid.master.kill(signal.SIGKILL)  # between the transfer and anything the grid wrote of it
    runner.join(15)
    assert interrupted
    fake.call(release.set)
    fake.call(setattr, fake.fake, "_held", None)
    grid.restart_master()

    ran = grid.client.run_payouts()["items"]

    assert [(p["state"], micro(p["amount"])) for p in ran] == [("paid", payable)]
    assert len(fake.fake.transfers) == 1  # nothing paid twice
    payouts = [line for line in grid.client.ledger(TEST_PROVIDER, limit=1000)["lines"] if line["kind"] == "payout"]
    assert [micro(line["amount"]) for line in payouts] == [-payable]
    assert grid.client.run_payouts()["items"] == []
    assert grid.client.reconcile_payouts()["differences"] == []


def test_a_reconciliation_finds_a_planted_difference(grid, fake, drop):
    payable = earned(grid, drop)
    connect(grid)
    [paid] = grid.client.run_payouts()["items"]
    assert micro(paid["amount"]) == payable
    assert grid.client.reconcile_payouts()["differences"] == []
    [transfer] = fake.fake.transfers
    fake.call(transfer.__setitem__, "amount", transfer["amount"] + 1)  # Stripe's record differs from the ledger's

    found = grid.client.reconcile_payouts()

    assert [(d["kind"], d["key"]) for d in found["differences"]] == [("amount", paid["id"])]
    events = grid.client.get("/api/v1/events", kind="payments.payout_mismatch")["items"]
    assert [e["data"]["kind"] for e in events] == ["amount"]
