"""Completion rates by close reason (management/market/completion.py, pure), and the gate on a real Master: a host
below the threshold leaves the offers (and renting it says why) until the operator reviews it; the rate is published on
its offer and its own route, a provider reading its own host's only."""

from __future__ import annotations

import time

from management.http.keys import SERVICES_KEY
from management.market.completion import CompletionPolicy, close_reason, completion_rates
from management.store import rental_repo
from master.records import RentalHost, RentalRecord
from tests.management.hosts import add_agent, api_key

T = 1_700_000_000.0
POLICY = CompletionPolicy(threshold=0.8, min_rentals=5)


def rental(n: int, *, ended_at: float | None = T, reason: str = "workload succeeded: done", failure: str = "") -> RentalRecord:
    hosts = [RentalHost(agent_id=a, provider="acme", gpus=1, price=1_000_000) for a in ("agt-1", "agt-2")]
    return RentalRecord(
        id=f"wl-{n}-a1", workload_id=f"wl-{n}", account="lab", kind="on_demand", hosts=hosts, started_at=T - 600,
        ended_at=ended_at, end_reason=reason, host_failure=failure,
    )  # fmt: skip


def test_each_rental_closes_for_one_reason_per_host():
    assert close_reason(rental(1), "agt-1") == "completed"
    assert close_reason(rental(1, reason="workload cancelled: by its owner"), "agt-1") == "cancelled"
    assert close_reason(rental(1, reason="workload failed: exit code 1"), "agt-1") == "failed"
    assert close_reason(rental(1, reason="workload failed: the renter's balance ran out"), "agt-1") == "failed"
    assert close_reason(rental(1, reason="workload queued: preempted by an on-demand rental"), "agt-1") == "requeued"
    lost = rental(1, reason="workload queued: agt-2 went offline", failure="agt-2: went offline")
    assert (close_reason(lost, "agt-2"), close_reason(lost, "agt-1")) == ("host_failure", "other_host")


def test_a_host_below_the_threshold_with_enough_rentals_is_under_review_until_reviewed():
    failure = "agt-2: went offline"
    rentals = [rental(n) for n in range(3)] + [rental(n, failure=failure, reason="workload queued: x") for n in range(3, 5)]
    rentals.append(rental(9, ended_at=None))  # still running: not counted
    rates = completion_rates(rentals, {}, POLICY)
    assert rates["agt-1"].rate == 1.0 and not rates["agt-1"].under_review
    assert rates["agt-1"].by_reason == {"completed": 3, "other_host": 2}
    assert (rates["agt-2"].rentals, rates["agt-2"].rate, rates["agt-2"].under_review) == (5, 0.6, True)
    assert rates["agt-2"].by_reason == {"completed": 3, "host_failure": 2}
    reviewed = completion_rates(rentals, {"agt-2": T}, POLICY)["agt-2"]  # the review counts from its time on
    assert (reviewed.rentals, reviewed.rate, reviewed.under_review, reviewed.reviewed_at) == (0, None, False, T)
    too_few = completion_rates(rentals[3:5], {}, POLICY)["agt-2"]
    assert (too_few.rate, too_few.under_review) == (None, False)  # 2 rentals say nothing
    off = completion_rates(rentals, {}, CompletionPolicy(threshold=0.0, min_rentals=5))["agt-2"]
    assert not off.under_review  # a threshold of 0 turns the gate off


async def test_a_host_under_review_is_not_offered_until_the_operator_reviews_it(api):
    await add_agent(api.master, "agt-a1", "a10:1", provider="acme", runtime="docker", isolation="container")
    acme = await api_key(api.master, "provider", "acme")
    bolt = await api_key(api.master, "provider", "bolt")
    lab = await api_key(api.master, "renter", "lab")
    now = time.time()
    host = [RentalHost(agent_id="agt-a1", provider="acme", gpus=1, price=0)]
    for n in range(5):
        failure = "agt-a1: went offline" if n < 2 else ""
        reason = "workload queued: agt-a1 went offline" if failure else "workload succeeded: done"
        rec = RentalRecord(
            id=f"wl-{n}-a1", workload_id=f"wl-{n}", account="lab", kind="on_demand", hosts=host, started_at=now - 900,
            ended_at=now - 60, end_reason=reason, host_failure=failure,
        )  # fmt: skip
        assert await rental_repo(api.master.store).insert(rec)
    offers = await (await api.get("/api/v1/offers", headers=lab)).json()
    assert [(o["id"], o["completion_rate"]) for o in offers["offers"]] == [("agt-a1", None)]  # not read yet

    await api.app[SERVICES_KEY].market.market.reliability.refresh()  # the market's loop does it every 10 minutes
    assert (await (await api.get("/api/v1/offers", headers=lab)).json())["offers"] == []
    refused = await api.post("/api/v1/offers/agt-a1/rent", json={"spec": {"name": "j", "image": "busybox"}}, headers=lab)
    assert refused.status == 404 and "completion rate (60% of 5)" in (await refused.json())["error"]["message"]
    page = await api.get("/api/v1/agents/agt-a1/completion", headers=acme)
    assert page.status == 200
    assert await page.json() == {
        "agent_id": "agt-a1", "rentals": 5, "by_reason": {"completed": 3, "host_failure": 2}, "rate": 0.6,
        "under_review": True, "reviewed_at": None,
    }  # fmt: skip
    assert (await api.get("/api/v1/agents/agt-a1/completion", headers=bolt)).status == 404
    assert (await api.post("/api/v1/agents/agt-a1/completion-review", headers=acme)).status == 403  # not its own to clear

    reviewed = await api.post("/api/v1/agents/agt-a1/completion-review", headers=api.auth)
    assert reviewed.status == 200, await reviewed.text()
    body = await reviewed.json()
    assert (body["under_review"], body["rentals"], body["reviewed_at"] is not None) == (False, 0, True)
    assert [o["id"] for o in (await (await api.get("/api/v1/offers", headers=lab)).json())["offers"]] == ["agt-a1"]
    events = await api.master.store.events.list(subject="agt-a1", kind_prefix="market.completion_reviewed")
    assert [(e.data["by"], e.data["rate"]) for e in events] == [("operator", 0.6)]
