"""Disputes through the real API on a real Master (SQLite in the test's tmp_path): a renter disputes its ended rental
within the window and the amount is held off its provider's earnings, the provider answers, the operator resolves
with a full, partial or no refund, each one ledger entry, and the books stay at zero. Hostile: another renter's rental,
another provider's dispute, past the window, negative, huge and malformed refunds, resolving twice, roles out of turn.
The rentals and their charges are posted through the market's own ledger book, as the meter posts them."""

from __future__ import annotations

import time

import pytest

from management.http.keys import SERVICES_KEY
from management.market.ledger import FEES, LedgerBook, provider_account, renter_account
from management.payments.disputes import dispute_account
from management.store import rental_repo
from master.records import LedgerEntry, LedgerLine, RentalHost, RentalRecord
from tests.management.hosts import add_agent, api_key

DAY = 86400.0


async def error_of(response) -> tuple[int, str, str]:
    error = (await response.json())["error"]
    return response.status, error["code"], error["message"]


def ledger_of(api) -> LedgerBook:
    return api.app[SERVICES_KEY].market.market.ledger


async def ended_rental(
    api, n: int, *, ended_ago: float, charge: int = 2_500_000, account: str = "lab", units: list[str] | None = None
) -> str:
    """Rental wl-<n>-a1 of ``account`` on agt-a1 (acme), ended ``ended_ago`` seconds ago, charged ``charge`` (10% fee),
    posted as the meter posts: the hold from the renter, the charge from the hold."""
    now = time.time()
    rid = f"wl-{n}-a1"
    host = RentalHost(agent_id="agt-a1", provider="acme", gpus=1, price=1_500_000, units=units or [])
    ended = None if ended_ago < 0 else now - ended_ago
    rec = RentalRecord(
        id=rid, workload_id=f"wl-{n}", account=account, kind="on_demand", hosts=[host], started_at=now - ended_ago - 3600,
        ended_at=ended, end_reason="workload succeeded",
    )  # fmt: skip
    assert await rental_repo(api.master.store).insert(rec)
    hold = [LedgerLine(account=renter_account(account), amount=-charge), LedgerLine(account=f"hold:{account}", amount=charge)]
    fee = charge // 10
    lines = [
        LedgerLine(account=f"hold:{account}", amount=-charge, host="agt-a1", workload=rec.workload_id),
        LedgerLine(account=provider_account("acme"), amount=charge - fee, host="agt-a1", workload=rec.workload_id),
        LedgerLine(account=FEES, amount=fee, host="agt-a1", workload=rec.workload_id),
    ]
    book = ledger_of(api)
    assert await book.post(LedgerEntry(key=f"hold:{rid}:0", ts=now, kind="hold", memo="hold", lines=hold, rental=rid))
    assert await book.post(LedgerEntry(key=f"charge:{rid}:end", ts=now, kind="charge", memo="end", lines=lines, rental=rid))
    return rid


@pytest.fixture
async def grid(api):
    """Provider acme's host agt-a1, provider bolt, renters lab (credited 100.00) and zoo, and lab's rental wl-1-a1 that
    ended a minute ago, charged 2.50 (2.25 to acme, 0.25 the fee)."""
    await add_agent(api.master, "agt-a1", "a10:1", provider="acme", runtime="docker", isolation="container")
    api.acme = await api_key(api.master, "provider", "acme")
    api.bolt = await api_key(api.master, "provider", "bolt")
    api.lab = await api_key(api.master, "renter", "lab")
    api.zoo = await api_key(api.master, "renter", "zoo")
    assert (await api.post("/api/v1/accounts/lab/credit", json={"amount": "100"}, headers=api.auth)).status == 201
    api.rental = await ended_rental(api, 1, ended_ago=60)
    return api


async def open_dispute(api, rental: str, headers, **extra) -> dict:
    response = await api.post("/api/v1/disputes", json={"rental": rental, "reason": "it was slow", **extra}, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


def books_at_zero(api) -> None:
    assert sum(ledger_of(api).balances().values()) == 0


async def test_a_dispute_holds_what_the_renter_paid_off_the_providers_earnings_with_its_evidence(grid):
    book = ledger_of(grid)
    dispute = await open_dispute(grid, grid.rental, grid.lab)
    assert (dispute["state"], dispute["disputable"], dispute["held"], dispute["fee"]) == ("open", "2.25", "2.25", "0.25")
    assert (dispute["account"], dispute["provider"], dispute["agent_id"]) == ("lab", "acme", "agt-a1")
    evidence = dispute["evidence"]
    assert evidence["seconds"] == 3600
    assert [c["key"] for c in evidence["charges"]] == [f"hold:{grid.rental}:0", f"charge:{grid.rental}:end"]
    assert [c["amount"] for c in evidence["charges"]] == ["0.00", "-2.50"]  # renter -> hold, then hold -> provider
    assert book.balance(provider_account("acme")) == 0  # the payout pays nothing of it until it is resolved
    assert book.balance(dispute_account(dispute["id"])) == 2_250_000
    books_at_zero(grid)
    # the provider reads it (about its host), another provider and renter do not
    assert (await grid.get(f"/api/v1/disputes/{dispute['id']}", headers=grid.acme)).status == 200
    assert (await grid.get(f"/api/v1/disputes/{dispute['id']}", headers=grid.bolt)).status == 404
    assert (await grid.get(f"/api/v1/disputes/{dispute['id']}", headers=grid.zoo)).status == 404
    assert [d["id"] for d in (await (await grid.get("/api/v1/disputes", headers=grid.lab)).json())["items"]] == [dispute["id"]]
    assert (await (await grid.get("/api/v1/disputes", headers=grid.zoo)).json())["items"] == []
    assert (await (await grid.get("/api/v1/disputes", headers=grid.bolt)).json())["items"] == []


async def test_the_provider_answers_and_the_operator_refunds_part_once(grid):
    book = ledger_of(grid)
    before = book.balance(renter_account("lab"))
    dispute = await open_dispute(grid, grid.rental, grid.lab)
    path = f"/api/v1/disputes/{dispute['id']}"
    answered = await grid.post(f"{path}/answer", json={"answer": "the renter's job was slow"}, headers=grid.acme)
    assert answered.status == 200, await answered.text()
    assert ((await answered.json())["state"], (await answered.json())["answer"]) == ("answered", "the renter's job was slow")
    resolved = await grid.post(
        f"{path}/resolution", json={"resolution": "partial", "amount": "1.00", "note": "half"}, headers=grid.auth
    )
    assert resolved.status == 200, await resolved.text()
    body = await resolved.json()
    assert (body["state"], body["resolution"], body["refunded"], body["released"]) == ("resolved", "partial", "1.00", "1.25")
    assert body["resolved_by"] == "operator" and body["note"] == "half"
    assert book.balance(renter_account("lab")) == before + 1_000_000
    assert book.balance(provider_account("acme")) == 1_250_000
    assert book.balance(dispute_account(dispute["id"])) == 0
    books_at_zero(grid)
    again = await grid.post(f"{path}/resolution", json={"resolution": "full"}, headers=grid.auth)
    status, _, message = await error_of(again)
    assert status == 409 and "already resolved (partial)" in message
    late = await grid.post(f"{path}/answer", json={"answer": "more"}, headers=grid.acme)
    assert late.status == 409
    assert book.balance(renter_account("lab")) == before + 1_000_000  # nothing moved twice
    entries = [e for e in await book.entries([dispute_account(dispute["id"])])]
    assert [e.kind for e in entries] == ["dispute_hold", "dispute_resolve"]


@pytest.mark.parametrize(
    ("resolution", "renter_gets", "provider_keeps"),
    [("full", 2_500_000, 0), ("none", 0, 2_250_000)],
)
async def test_a_full_refund_returns_the_fee_too_and_none_returns_it_all_to_the_provider(
    grid, resolution, renter_gets, provider_keeps
):
    book = ledger_of(grid)
    before, fees = book.balance(renter_account("lab")), book.balance(FEES)
    dispute = await open_dispute(grid, grid.rental, grid.lab)
    resolved = await grid.post(f"/api/v1/disputes/{dispute['id']}/resolution", json={"resolution": resolution}, headers=grid.auth)
    assert resolved.status == 200, await resolved.text()
    assert book.balance(renter_account("lab")) == before + renter_gets
    assert book.balance(provider_account("acme")) == provider_keeps
    assert book.balance(FEES) == fees - (renter_gets - 2_250_000 if renter_gets else 0)
    books_at_zero(grid)


async def test_a_renter_cannot_dispute_anothers_rental_one_still_running_or_past_the_window_or_twice(grid):
    status, _, message = await error_of(
        await grid.post("/api/v1/disputes", json={"rental": grid.rental, "reason": "x"}, headers=grid.zoo)
    )
    assert (status, message) == (404, f"no rental {grid.rental!r}")
    old = await ended_rental(grid, 2, ended_ago=8 * DAY)
    status, _, message = await error_of(
        await grid.post("/api/v1/disputes", json={"rental": old, "reason": "x"}, headers=grid.lab)
    )
    assert status == 409 and "within 7 days of its end" in message
    running = await ended_rental(grid, 3, ended_ago=-1)
    status, _, message = await error_of(
        await grid.post("/api/v1/disputes", json={"rental": running, "reason": "x"}, headers=grid.lab)
    )
    assert status == 409 and "still running" in message
    await open_dispute(grid, grid.rental, grid.lab)
    status, _, message = await error_of(
        await grid.post("/api/v1/disputes", json={"rental": grid.rental, "reason": "x"}, headers=grid.lab)
    )
    assert status == 409 and "already disputed" in message
    status, code, _ = await error_of(await grid.post("/api/v1/disputes", json={"rental": old, "reason": "   "}, headers=grid.lab))
    assert (status, code) == (400, "invalid_dispute")
    # a provider opens none
    assert (await grid.post("/api/v1/disputes", json={"rental": grid.rental, "reason": "x"}, headers=grid.acme)).status == 403
    books_at_zero(grid)


async def test_a_provider_answers_only_a_dispute_about_its_host_and_only_the_operator_resolves(grid):
    dispute = await open_dispute(grid, grid.rental, grid.lab)
    path = f"/api/v1/disputes/{dispute['id']}"
    assert (await grid.post(f"{path}/answer", json={"answer": "not mine"}, headers=grid.bolt)).status == 404
    assert (await grid.post(f"{path}/answer", json={"answer": "mine"}, headers=grid.lab)).status == 403
    for who in (grid.lab, grid.acme):
        assert (await grid.post(f"{path}/resolution", json={"resolution": "full"}, headers=who)).status == 403
    got = await (await grid.get(path, headers=grid.lab)).json()
    assert (got["state"], got["answer"], got["resolution"]) == ("open", None, None)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"resolution": "partial", "amount": "-1"}, "must be more than 0"),
        ({"resolution": "partial", "amount": "0"}, "more than 0 and at most what is held (2.25)"),
        ({"resolution": "partial", "amount": "2.26"}, "at most what is held (2.25)"),
        ({"resolution": "partial", "amount": "999999999"}, "at most what is held (2.25)"),
        ({"resolution": "partial", "amount": "1e9"}, "amount"),
        ({"resolution": "partial", "amount": "0.0000001"}, "amount"),
        ({"resolution": "partial"}, "names its amount"),
        ({"resolution": "full", "amount": "1"}, "takes no amount"),
    ],
)
async def test_a_negative_huge_or_malformed_refund_is_refused_and_moves_nothing(grid, body, says):
    book = ledger_of(grid)
    dispute = await open_dispute(grid, grid.rental, grid.lab)
    before = book.balances()
    status, code, message = await error_of(
        await grid.post(f"/api/v1/disputes/{dispute['id']}/resolution", json=body, headers=grid.auth)
    )
    assert (status, code) == (400, "invalid_dispute") and says in message, message
    assert book.balances() == before
    assert (await (await grid.get(f"/api/v1/disputes/{dispute['id']}", headers=grid.auth)).json())["state"] == "open"


async def test_the_evidence_holds_the_hosts_faults_exits_and_verification_in_the_rentals_span_only(grid):
    [gpu] = [g.uuid for g in grid.master.gpus("agt-a1")]
    master = grid.master
    await master.record_event("container.exited", "agt-a1", container="wl-2-r0-a1", code=137)
    await master.record_event("container.exited", "agt-a1", container="wl-9-r0-a1", code=0)  # another workload's
    await master.record_event("gpu.fault", gpu, agent_id="agt-a1", kind="xid", reason="Xid 79", code=79)
    await master.record_event("gpu.verification", gpu, outcome="passed")
    rental = await ended_rental(grid, 2, ended_ago=30, units=[gpu])  # its span reaches a minute past its end: now
    evidence = (await open_dispute(grid, rental, grid.lab))["evidence"]
    assert [(e["kind"], e["data"]["container"]) for e in evidence["exits"]] == [("container.exited", "wl-2-r0-a1")]
    assert [(e["kind"], e["subject"]) for e in evidence["faults"] if e["kind"] == "gpu.fault"] == [("gpu.fault", gpu)]
    assert [e["data"]["outcome"] for e in evidence["verification"]] == ["passed"]
    assert evidence["truncated"] is False
    early = await ended_rental(grid, 3, ended_ago=6 * DAY, units=[gpu])  # long before those events
    evidence = (await open_dispute(grid, early, grid.lab))["evidence"]
    assert (evidence["exits"], evidence["verification"]) == ([], [])
    assert not [e for e in evidence["faults"] if e["kind"] == "gpu.fault"]


async def test_the_disputes_list_pages_with_a_cursor_bound_to_its_filters(grid):
    opened = []
    for n in range(2, 7):  # five more rentals of lab's, each disputed
        opened.append((await open_dispute(grid, await ended_rental(grid, n, ended_ago=60), grid.lab))["id"])
    seen, cursor, pages = [], None, 0
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        body = await (await grid.get(f"/api/v1/disputes{query}", headers=grid.lab)).json()
        seen += [d["id"] for d in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and seen == opened[::-1]  # newest first, each once
    first = await (await grid.get("/api/v1/disputes?limit=2", headers=grid.lab)).json()
    # a cursor is the list's own: with other filters, or made up, a 400 that says so
    other = await grid.get(f"/api/v1/disputes?limit=2&rental={grid.rental}&cursor={first['next_cursor']}", headers=grid.lab)
    assert (await error_of(other))[:2] == (400, "bad_cursor")
    made_up = await grid.get("/api/v1/disputes?cursor=WyJkaXNwdXRlcyJd", headers=grid.lab)
    assert (await error_of(made_up))[:2] == (400, "bad_cursor")
    # another renter's pages hold none of them
    assert (await (await grid.get("/api/v1/disputes?limit=2", headers=grid.zoo)).json()) == {"items": [], "next_cursor": None}


async def test_the_disputes_list_filters_by_state_in_the_store_and_its_cursor_keeps_the_state(grid):
    ids = [(await open_dispute(grid, await ended_rental(grid, n, ended_ago=60), grid.lab))["id"] for n in range(2, 6)]
    await grid.post(f"/api/v1/disputes/{ids[0]}/answer", json={"answer": "it ran"}, headers=grid.acme)
    resolved = await grid.post(f"/api/v1/disputes/{ids[1]}/resolution", json={"resolution": "none"}, headers=grid.auth)
    assert resolved.status == 200, await resolved.text()

    async def listed(query: str, headers) -> list[tuple[str, str]]:
        seen, cursor = [], None
        while True:
            page = f"/api/v1/disputes?{query}" + (f"&cursor={cursor}" if cursor else "")
            body = await (await grid.get(page, headers=headers)).json()
            seen += [(d["id"], d["state"]) for d in body["items"]]
            if (cursor := body["next_cursor"]) is None:
                return seen

    assert await listed("state=unresolved&limit=1", grid.auth) == [(ids[3], "open"), (ids[2], "open"), (ids[0], "answered")]
    assert await listed("state=open&limit=1", grid.lab) == [(ids[3], "open"), (ids[2], "open")]
    assert await listed("state=resolved", grid.acme) == [(ids[1], "resolved")]
    assert await listed("state=answered", grid.zoo) == []  # another renter's: none
    first = await (await grid.get("/api/v1/disputes?state=open&limit=1", headers=grid.lab)).json()
    other = await grid.get(f"/api/v1/disputes?state=resolved&limit=1&cursor={first['next_cursor']}", headers=grid.lab)
    assert (await error_of(other))[:2] == (400, "bad_cursor")
    status, _, message = await error_of(await grid.get("/api/v1/disputes?state=lost", headers=grid.lab))
    assert status == 400 and "state" in message
