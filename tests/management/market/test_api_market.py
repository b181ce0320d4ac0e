"""The market through the real API on a real Master (SQLite in the test's tmp_path): offers and their search, renting an
offer (refused at once when the offer cannot take it), bids, credits and balances, the ledger as JSON and CSV, rentals.
The hosts are simulated (no GPU here): add_agent registers them as a hello would.
"""

from __future__ import annotations

import csv
import io

import pytest

from management.store import ledger_repo, rental_repo
from tests.management.hosts import add_agent, api_key


async def error_of(response) -> tuple[int, str, str]:
    error = (await response.json())["error"]
    return response.status, error["code"], error["message"]


@pytest.fixture
async def market(api):
    """Provider acme with a 1-GPU and a 2-GPU host (container isolation), priced; renters lab and zoo."""
    await add_agent(api.master, "agt-a1", "a10:1", provider="acme", runtime="docker", isolation="container")
    await add_agent(api.master, "agt-a2", "a10:2", provider="acme", runtime="docker", isolation="container")
    api.acme = await api_key(api.master, "provider", "acme")
    api.lab = await api_key(api.master, "renter", "lab")
    api.zoo = await api_key(api.master, "renter", "zoo")
    put = await api.put("/api/v1/prices/default", json={"on_demand": "1.50", "min_bid": "0.40"}, headers=api.acme)
    assert put.status == 200, await put.text()
    put = await api.put("/api/v1/agents/agt-a2/price", json={"on_demand": "3", "reserved_discount": 0.5}, headers=api.acme)
    assert put.status == 200, await put.text()
    return api


@pytest.fixture
async def funded(market):
    """``market`` with renter lab credited 100.00 (zoo has nothing): work starts only on a balance that pays for it."""
    credited = await market.post("/api/v1/accounts/lab/credit", json={"amount": "100"}, headers=market.auth)
    assert credited.status == 201, await credited.text()
    return market


def spec(**rental: object) -> dict[str, object]:
    body: dict[str, object] = {"name": "job", "image": "python:3.11", "command": ["sleep", "60"]}
    if rental:
        body["rental"] = rental
    return body


async def test_a_renter_searches_offers_and_a_price_change_shows_in_the_next_search(market):
    found = await market.get("/api/v1/offers", params={"q": "num_gpus>=1 price<=2"}, headers=market.lab)
    assert found.status == 200, await found.text()
    body = await found.json()
    assert [o["id"] for o in body["offers"]] == ["agt-a1"]
    [offer] = body["offers"]
    assert (offer["price"], offer["min_bid"], offer["num_gpus"], offer["provider"]) == ("1.50", "0.40", 1, "acme")
    await market.put("/api/v1/agents/agt-a2/price", json={"on_demand": "1.10"}, headers=market.acme)
    again = await (await market.get("/api/v1/offers", params={"q": "price<=2", "sort": "price"}, headers=market.lab)).json()
    assert [o["id"] for o in again["offers"]] == ["agt-a2", "agt-a1"]


async def test_a_renter_finds_a_simulated_amd_host_by_its_vendor(market):
    """Issue 41, point 3: an offer carries its cards' vendor and the search language filters on it."""
    await add_agent(market.master, "agt-amd", "mi300x:8", provider="acme", runtime="docker", isolation="container")
    amd = await (await market.get("/api/v1/offers", params={"q": "vendor=amd"}, headers=market.lab)).json()
    assert [(o["id"], o["vendor"], o["model"], o["tier"], o["num_gpus"]) for o in amd["offers"]] == [
        ("agt-amd", "amd", "mi300x", "amd-flagship", 8)
    ]
    others = await (await market.get("/api/v1/offers", params={"q": "vendor!=amd", "sort": "id"}, headers=market.lab)).json()
    assert [(o["id"], o["vendor"]) for o in others["offers"]] == [("agt-a1", "nvidia"), ("agt-a2", "nvidia")]
    both = await (await market.get("/api/v1/offers", params={"q": "vendor in [amd,nvidia]"}, headers=market.lab)).json()
    assert both["total"] == 3


async def test_a_query_that_does_not_parse_is_a_400_naming_the_position_and_the_token(market):
    response = await market.get("/api/v1/offers", params={"q": "gpu_ram=>24"}, headers=market.lab)
    status, code, message = await error_of(response)
    assert (status, code) == (400, "bad_request")
    assert "position 7" in message and "'=>'" in message, message


async def test_an_empty_search_says_which_condition_emptied_it(market):
    body = await (await market.get("/api/v1/offers", params={"q": "num_gpus>=1 price<0.5"}, headers=market.lab)).json()
    assert body["offers"] == []
    assert body["emptied_by"]["condition"] == "price<0.5"
    assert "price<0.5" in body["emptied_by"]["sentence"]


async def test_renting_an_offer_pins_the_workload_to_its_host_and_states_the_terms(funded):
    response = await funded.post("/api/v1/offers/agt-a1/rent", json={"spec": spec()}, headers=funded.lab)
    assert response.status == 201, await response.text()
    workload = await response.json()
    assert workload["account"] == "lab" and workload["state"] == "queued"
    terms = {"kind": "on_demand", "max_price": None, "bid": None, "offer": "agt-a1", "reserved_s": None}
    assert workload["spec"]["rental"] == terms
    assert workload["rental"]["kind"] == "on_demand"
    assert workload["rental"]["summary"].startswith("on demand at 1.50 USD per GPU-hour (offer agt-a1's price now)")


@pytest.mark.parametrize(
    ("offer", "body", "status", "says"),
    [
        ("agt-a1", spec(kind="interruptible", bid="0.30"), 409, "under offer agt-a1's minimum bid 0.40"),
        ("agt-a2", spec(kind="interruptible", bid="1"), 409, "not rented interruptible"),
        ("agt-a1", spec(kind="on_demand", max_price="1.00"), 409, "over your max_price 1.00"),
        ("agt-a2", spec(kind="reserved", reserved_s=86400), 402, "prepaid: 36.00 USD"),
        ("agt-zz", spec(), 404, "no offer 'agt-zz'"),
    ],
)
async def test_an_offer_that_cannot_take_the_rental_is_refused_at_once_saying_why(market, offer, body, status, says):
    response = await market.post(f"/api/v1/offers/{offer}/rent", json={"spec": body}, headers=market.lab)
    got_status, _, message = await error_of(response)
    assert got_status == status and says in message, message
    assert (await market.get("/api/v1/workloads", headers=market.lab)).status == 200  # still serving everyone


async def test_renting_more_gpus_than_the_offer_has_free_is_refused(market):
    body = spec()
    body["replica"] = {"gpus": 2}
    status, _, message = await error_of(await market.post("/api/v1/offers/agt-a1/rent", json={"spec": body}, headers=market.lab))
    assert status == 409 and "has 1 GPU(s) free or held by interruptible rentals now" in message


async def test_the_operator_credits_a_renter_who_reads_its_balance_and_ledger_and_no_one_else_can(market):
    credited = await market.post("/api/v1/accounts/lab/credit", json={"amount": "25.50", "memo": "prepaid"}, headers=market.auth)
    assert credited.status == 201, await credited.text()
    assert (await credited.json())["balance"]["available"] == "25.50"
    balance = await (await market.get("/api/v1/accounts/lab/balance", headers=market.lab)).json()
    assert (balance["available"], balance["held"], balance["currency"]) == ("25.50", "0.00", "USD")
    assert (await market.post("/api/v1/accounts/lab/credit", json={"amount": "1"}, headers=market.lab)).status == 403
    assert (await market.get("/api/v1/accounts/lab/balance", headers=market.zoo)).status == 404
    assert (await market.get("/api/v1/accounts/lab/ledger", headers=market.zoo)).status == 404
    provider_credit = await market.post("/api/v1/accounts/acme/credit", json={"amount": "1"}, headers=market.auth)
    status, _, message = await error_of(provider_credit)
    assert status == 409 and "only renters' balances are credited" in message
    ledger = await (await market.get("/api/v1/accounts/lab/ledger", headers=market.lab)).json()
    [line] = ledger["lines"]
    assert (line["kind"], line["amount"], line["balance"], line["memo"]) == ("credit", "25.50", "25.50", "prepaid")
    as_csv = await market.get("/api/v1/accounts/lab/ledger", params={"format": "csv"}, headers=market.lab)
    assert as_csv.status == 200 and as_csv.content_type == "text/csv"
    rows = list(csv.reader(io.StringIO(await as_csv.text())))
    assert len(rows) == 2 and "25.50" in rows[1]


async def test_a_bad_amount_is_a_400_naming_the_field(market):
    for amount in ("-1", "1.2345678", "1e3", "abc", ""):
        response = await market.post("/api/v1/accounts/lab/credit", json={"amount": amount}, headers=market.auth)
        status, _, message = await error_of(response)
        assert status == 400 and "amount" in message, (amount, message)


async def test_a_queued_interruptible_workloads_bid_changes_and_an_on_demand_one_has_none(funded):
    rented = await funded.post(
        "/api/v1/offers/agt-a1/rent", json={"spec": spec(kind="interruptible", bid="0.50")}, headers=funded.lab
    )
    workload = await rented.json()
    changed = await funded.post(f"/api/v1/workloads/{workload['id']}/bid", json={"bid": "0.75"}, headers=funded.lab)
    assert changed.status == 200, await changed.text()
    assert (await changed.json())["rental"]["bid"] == "0.75"
    assert (await funded.post(f"/api/v1/workloads/{workload['id']}/bid", json={"bid": "1"}, headers=funded.zoo)).status == 404
    on_demand = await (await funded.post("/api/v1/offers/agt-a1/rent", json={"spec": spec()}, headers=funded.lab)).json()
    status, _, message = await error_of(
        await funded.post(f"/api/v1/workloads/{on_demand['id']}/bid", json={"bid": "1"}, headers=funded.lab)
    )
    assert status == 409 and "only an interruptible workload has a bid" in message


async def test_rentals_are_listed_per_owner_and_a_missing_one_answers_404(market):
    listed = await market.get("/api/v1/rentals", headers=market.lab)
    assert (listed.status, (await listed.json())["items"]) == (200, [])
    assert (await market.get("/api/v1/rentals/wl-0-a1", headers=market.lab)).status == 404
    assert (await market.post("/api/v1/rentals/wl-0-a1/rating", json={"rating": 6}, headers=market.lab)).status == 400
    assert (await market.get("/api/v1/accounts/acme/earnings", headers=market.acme)).status == 200
    bolt = await api_key(market.master, "provider", "bolt")
    for path in ("earnings", "payouts", "ledger", "balance"):  # another account's money answers as a missing one
        assert (await market.get(f"/api/v1/accounts/acme/{path}", headers=bolt)).status == 404, path
        assert (await market.get(f"/api/v1/accounts/acme/{path}", headers=market.lab)).status == 404, path
    assert (await market.get("/api/v1/accounts/acme/payouts", params={"period": "week"}, headers=market.acme)).status == 200


async def test_a_renter_rates_an_ended_rental_once_and_it_counts_in_the_hosts_reputation(market):
    """D12: a rating counts only for a rental that ran the minimum time (600 s by default) and was paid, weighted by what
    was paid on the host (1 + 1 per 1.00, at most 4), at most one per renter and host in the window (30 days). The
    rentals and their charges are written into the store as the meter writes them."""
    import time

    from master.records import LedgerEntry, LedgerLine, RentalHost, RentalRecord

    now = time.time()
    host = RentalHost(agent_id="agt-a1", provider="acme", gpus=1, price=1_500_000)

    def rental(n: int, ran: float | None) -> RentalRecord:
        ended = None if ran is None else now - 5
        start = now - 5 - (ran or 60)
        return RentalRecord(
            id=f"wl-{n}-a1",
            workload_id=f"wl-{n}",
            account="lab",
            kind="on_demand",
            hosts=[host],
            started_at=start,
            ended_at=ended,
        )

    def charge(r: RentalRecord, amount: int) -> LedgerEntry:
        lines = [
            LedgerLine(account="hold:lab", amount=-amount, host="agt-a1", workload=r.workload_id),
            LedgerLine(account="provider:acme", amount=amount - amount // 10, host="agt-a1", workload=r.workload_id),
            LedgerLine(account="platform:fees", amount=amount // 10, host="agt-a1", workload=r.workload_id),
        ]
        return LedgerEntry(key=f"charge:{r.id}:end", ts=now, kind="charge", memo="metered", lines=lines, rental=r.id)

    paid, running, short, unpaid, again = rental(1, 700), rental(2, None), rental(3, 30), rental(4, 700), rental(5, 900)
    for r in (paid, running, short, unpaid, again):
        assert await rental_repo(market.master.store).insert(r)
    for r, amount in ((paid, 2_500_000), (short, 12_500), (again, 375_000)):
        assert await ledger_repo(market.master.store).post(charge(r, amount)) is not None
    before = market.master.registry.agents["agt-a1"]
    count, total = before.ratings_count, before.ratings_sum

    rated = await market.post("/api/v1/rentals/wl-1-a1/rating", json={"rating": 5}, headers=market.lab)
    assert rated.status == 200, await rated.text()
    assert (await rated.json())["rating"] == 5
    agent = market.master.registry.agents["agt-a1"]
    assert (agent.ratings_count, agent.ratings_sum) == (count + 3, total + 15)  # 2.50 paid: weight 3
    for rental_id, says in (
        ("wl-1-a1", "already rated 5"),
        ("wl-2-a1", "still running"),
        ("wl-3-a1", "ran 30 s; a rating counts for a rental that ran at least 600 s"),
        ("wl-4-a1", "was not paid for"),
        ("wl-5-a1", "you rated host agt-a1 for rental wl-1-a1 within the last 30 days"),
    ):
        status, _, message = await error_of(
            await market.post(f"/api/v1/rentals/{rental_id}/rating", json={"rating": 1}, headers=market.lab)
        )
        assert status == 409 and says in message, (rental_id, message)
    assert (agent.ratings_count, agent.ratings_sum) == (count + 3, total + 15)  # none of those counted
    assert (await market.post("/api/v1/rentals/wl-1-a1/rating", json={"rating": 1}, headers=market.zoo)).status == 404
    events = await market.master.store.events.list(subject="agt-a1", kind_prefix="agent.reputation")
    assert [e.data["component"] for e in events] == ["ratings"] and "weight 3" in events[0].data["reason"]
    seen_by_provider = await (await market.get("/api/v1/rentals/wl-1-a1", headers=market.acme)).json()
    assert "account" not in seen_by_provider and seen_by_provider["rating"] == 5  # the renter stays the renter's
    bolt = await api_key(market.master, "provider", "bolt")  # not its host: as missing
    assert (await market.get("/api/v1/rentals/wl-1-a1", headers=bolt)).status == 404
    assert (await (await market.get("/api/v1/rentals", headers=bolt)).json())["items"] == []


async def placed(market, workload_id: str, agent_id: str) -> None:
    """The scheduler's placement of a workload on ``agent_id`` (one GPU), applied through the workload book as its loop
    applies it: the API's Master runs no scheduling loop here."""
    from management.http.keys import SERVICES_KEY
    from management.workloads.spec import container_name
    from master.records import Assignment

    book = market.server.app[SERVICES_KEY].workloads.book
    unit = market.master.gpus(agent_id)[0].uuid
    assignment = Assignment(replica=0, agent_id=agent_id, units=[unit], container=container_name(workload_id, 0, 1))
    await book.transition(workload_id, "schedule", "placed", 0.0, assignments=[assignment])


@pytest.mark.parametrize("then_start", [False, True])
async def test_a_bid_lowered_while_scheduled_or_starting_is_checked_against_the_hosts_minimum(funded, then_start):
    """D2: a placed workload (scheduled or starting) is held to its host's minimum bid, as a running one is."""
    rented = await funded.post(
        "/api/v1/offers/agt-a1/rent", json={"spec": spec(kind="interruptible", bid="0.50")}, headers=funded.lab
    )
    workload = (await rented.json())["id"]
    await placed(funded, workload, "agt-a1")
    if then_start:
        from management.http.keys import SERVICES_KEY

        await funded.server.app[SERVICES_KEY].workloads.book.transition(workload, "start", "acknowledged", 0.0)
    lowered = await funded.post(f"/api/v1/workloads/{workload}/bid", json={"bid": "0.000001"}, headers=funded.lab)
    status, _, message = await error_of(lowered)
    assert status == 409 and "agt-a1" in message and "takes bids from 0.40" in message, message
    shown = await (await funded.get(f"/api/v1/workloads/{workload}", headers=funded.lab)).json()
    assert shown["rental"]["bid"] == "0.50"
    raised = await funded.post(f"/api/v1/workloads/{workload}/bid", json={"bid": "0.45"}, headers=funded.lab)
    assert raised.status == 200, await raised.text()


async def test_a_rent_or_submit_the_balance_cannot_pay_one_metering_period_of_is_refused_with_the_figures(market):
    """D14 and money before work: a balance that does not pay one metering period (60 s) of the work is refused at
    once with 402 and the figures; a balance that does is let in. 2 GPUs at 1.50 (the cheapest host): 3.00 an hour,
    0.05 a period."""
    two = spec()
    two["replica"] = {"gpus": 2}
    await market.post("/api/v1/accounts/zoo/credit", json={"amount": "0.000001"}, headers=market.auth)
    for path, body in (("/api/v1/offers/agt-a2/rent", {"spec": spec()}), ("/api/v1/workloads", two)):
        response = await market.post(path, json=body, headers=market.zoo)
        status, code, message = await error_of(response)
        assert (status, code) == (402, "insufficient_funds"), message
        assert "needed 0.05 USD" in message and "balance available is 0.000001 USD" in message, message
        assert "per hour" in message, message
    interruptible = spec(kind="interruptible", bid="0.50")
    status, _, message = await error_of(await market.post("/api/v1/workloads", json=interruptible, headers=market.zoo))
    assert status == 402 and "(your bid)" in message and "needed 0.008334 USD" in message, message
    listed = await (await market.get("/api/v1/workloads", headers=market.zoo)).json()
    assert listed["items"] == []  # nothing queued that could never start
    await market.post("/api/v1/accounts/zoo/credit", json={"amount": "0.05"}, headers=market.auth)
    accepted = await market.post("/api/v1/workloads", json=two, headers=market.zoo)
    assert accepted.status == 201, await accepted.text()


async def test_on_a_grid_with_a_free_host_an_empty_balance_may_still_submit(market):
    await add_agent(market.master, "agt-free", "a10:1", provider="bolt", runtime="docker", isolation="container")
    accepted = await market.post("/api/v1/workloads", json=spec(), headers=market.zoo)
    assert accepted.status == 201, await accepted.text()
