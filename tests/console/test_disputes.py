"""Disputes and the completion review in the console (docs/disputes.md, "Console"), in Debian's Chromium against a real
Master: a renter disputes its ended rental from the workload's page and follows it, the host's provider answers, the
operator reads the evidence and resolves it with a partial refund (the ledger moved once, as the API's resolution
moves it), and clears a host held for completion review. Hostile: another renter's rental, another provider's
dispute, a renter resolving, a provider opening or reviewing, bad amounts, a closed window, a form without its CSRF
token; each refused, and nothing moves.

The rentals and their charges are put in the store and posted through the market's ledger book as the meter posts them
(the hosts are simulated: no GPU here), as tests/management/payments/test_api_disputes.py does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from management.market.ledger import FEES, provider_account, renter_account
from management.market.money import parse_amount
from management.payments.disputes import dispute_account
from management.store import rental_repo
from master.port import LedgerEntry, LedgerLine, RentalHost, RentalRecord, WorkloadSpec
from master.records import AccountRecord
from tests.console.conftest import ConsoleMaster
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DAY = 86400.0
CHARGE = 2_500_000  # 2.50: 2.25 to the provider, 0.25 the platform's fee
OTHERS = {"bolt": ("provider", "bolt-password-1"), "otto": ("renter", "otto-password-1")}


async def ended_rental(
    master: ConsoleMaster, rid: str, workload_id: str, *, account: str = "rita", ended_ago: float = 120.0,
    agent_id: str = "agt-a1", host_failure: str = "", charge: int = CHARGE,
) -> RentalRecord:  # fmt: skip
    """A rental of ``account`` on ``agent_id`` (acme's) that ended ``ended_ago`` seconds ago after an hour, charged as
    the meter charges: the hold from the renter, the charge from the hold to the provider and the fee."""
    store = master.server.master.store
    now = time.time()
    units = [g.uuid for g in master.server.master.gpus(agent_id)][:1]
    host = RentalHost(agent_id=agent_id, provider="acme", gpus=1, price=1_500_000, units=units)
    rental = RentalRecord(
        id=rid, workload_id=workload_id, account=account, kind="on_demand", hosts=[host], started_at=now - ended_ago - 3600,
        ended_at=now - ended_ago, end_reason="workload failed: exit code 137" if host_failure else "workload succeeded",
        host_failure=host_failure,
    )  # fmt: skip
    assert await rental_repo(store).insert(rental)
    if charge:
        book = master.services.market.market.ledger
        fee = charge // 10
        hold = [LedgerLine(account=renter_account(account), amount=-charge), LedgerLine(account=f"hold:{account}", amount=charge)]
        lines = [
            LedgerLine(account=f"hold:{account}", amount=-charge, host=agent_id, workload=workload_id),
            LedgerLine(account=provider_account("acme"), amount=charge - fee, host=agent_id, workload=workload_id),
            LedgerLine(account=FEES, amount=fee, host=agent_id, workload=workload_id),
        ]
        memo = f"{rid}: 1 h on {agent_id}"
        assert await book.post(LedgerEntry(key=f"hold:{rid}:0", ts=now, kind="hold", memo="hold", lines=hold, rental=rid))
        assert await book.post(LedgerEntry(key=f"charge:{rid}:end", ts=now, kind="charge", memo=memo, lines=lines, rental=rid))
    return rental


@pytest.fixture
def grid(console_master: ConsoleMaster) -> ConsoleMaster:
    """acme's host agt-a1; provider bolt and renter otto (with console passwords); rita credited 100.00 with a workload
    whose rental ``wl-…-a1`` on agt-a1 ended 30 s ago (charged 2.50) with a GPU fault and a container exit in
    its span; an old rental of rita's (ended 8 days ago) and one of otto's."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        await add_agent(master, "agt-a1", "a10:2", provider="acme", runtime="docker", isolation="container")
        for account, (role, password) in OTHERS.items():
            await master.accounts.create(AccountRecord(id=account, role=role))
            await master.accounts.set_password(account, password)
        for renter in ("rita", "otto"):
            await services.market.credit(renter, parse_amount("100"), "welcome", key=f"welcome-{renter}")
        record = await services.workloads.submit_workload("rita", WorkloadSpec(name="train", image="python:3.12"))
        while not (await services.workloads.get_workload(record.id)).assignments:  # the scheduler places it
            await asyncio.sleep(0.05)
        [gpu] = [g.uuid for g in master.gpus("agt-a1")][:1]
        await master.record_event("gpu.fault", gpu, agent_id="agt-a1", kind="xid", reason="Xid 79: fell off the bus", code=79)
        await master.record_event("container.exited", "agt-a1", container=f"{record.id}-r0-a1", code=137)
        console_master.workload_id = record.id  # type: ignore[attr-defined]
        console_master.rental = (await ended_rental(console_master, f"{record.id}-a1", record.id, ended_ago=30)).id  # type: ignore[attr-defined]
        console_master.old = (await ended_rental(console_master, "wl-old-a1", "wl-old", ended_ago=8 * DAY)).id  # type: ignore[attr-defined]
        console_master.others = (await ended_rental(console_master, "wl-otto-a1", "wl-otto", account="otto")).id  # type: ignore[attr-defined]

    console_master.run(seed())
    return console_master


def open_dispute(grid: Any, rental: str) -> str:
    """The renter's dispute, opened through the service the API and the console call."""
    rec = grid.run(grid.services.disputes.open(rental, "it crashed after an hour", agent_id=None, owner="rita"))
    return rec.id


def sign_in_account(page: Any, url: str, account: str, password: str) -> None:
    page.goto(f"{url}/console/signin")
    page.get_by_label("Account").fill(account)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda u: "/console/signin" not in u)


def post_form(page: Any, url: str, path: str, form: dict[str, str], *, token: bool = True) -> Any:
    """A form posted from this console's origin with the page's session (and its CSRF token unless ``token`` is False),
    as a hand-made form would be."""
    if token:
        form = {"csrf_token": page.locator("meta[name=csrf-token]").get_attribute("content"), **form}
    return page.request.post(f"{url}{path}", form=form, headers={"Origin": url}, max_redirects=0)


def nav(page: Any, label: str) -> Any:
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=label)


def audited(grid: Any, account: str) -> list[tuple[str, str, str]]:
    """The account's audit events: (method, route, target), as a console write records them."""
    events = grid.run(grid.server.master.events_after(subject=account, kind_prefix="audit"))
    return [(e.data["method"], e.data["route"], e.data["target"]) for e in events]


def balances(grid: Any) -> dict[str, int]:
    return dict(grid.services.market.market.ledger.balances())


def test_a_renter_disputes_its_ended_rental_from_the_workload_page_and_follows_it(grid, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/workloads/{grid.workload_id}")
    expect(page.get_by_role("link", name=f"Dispute rental {grid.rental}")).to_be_visible()
    shot(page, "workload-rental-to-dispute")
    page.get_by_role("link", name=f"Dispute rental {grid.rental}").click()
    page.wait_for_url(f"**/console/disputes/new?rental={grid.rental}")
    expect(page.get_by_role("heading", name="Open a dispute")).to_be_visible()
    expect(page.locator("#deadline")).to_be_visible()
    shot(page, "dispute-form")

    page.get_by_role("button", name="Open the dispute").click()  # no reason
    expect(page.locator("#reason-error")).to_have_text("The reason must say why (it is empty)")
    earned = balances(grid)[provider_account("acme")]  # 2.25 from each of the three rentals
    assert earned == 3 * 2_250_000  # nothing held
    shot(page, "reason-missing")

    page.get_by_label("What went wrong").fill("The job was killed after an hour (exit 137); the host lost its GPU.")
    page.get_by_role("button", name="Open the dispute").click()
    page.wait_for_url("**/console/disputes/dsp-*")
    expect(page.locator(".flashes")).to_contain_text("2.25 USD is held off the provider's earnings")
    expect(page.locator("#dispute-state")).to_have_text("open")
    expect(page.locator("#held")).to_contain_text("2.25 USD")
    expect(page.locator("#answer")).to_have_text("none yet")
    expect(page.locator("#evidence-faults-count")).not_to_have_text("0")
    expect(page.locator("#evidence-exits-count")).to_have_text("1")
    expect(page.locator("#answer-form")).to_have_count(0)  # a renter answers nothing
    expect(page.locator("#resolve-form")).to_have_count(0)  # nor resolves
    shot(page, "dispute-opened")
    dispute_id = page.url.rsplit("/", 1)[1]
    assert balances(grid).get(dispute_account(dispute_id)) == 2_250_000
    assert balances(grid)[provider_account("acme")] == earned - 2_250_000
    assert ("POST", "/console/disputes", dispute_id) in audited(grid, "rita")

    page.goto(f"{grid.url}/console/workloads/{grid.workload_id}")  # the rental now links its dispute, and no new one
    expect(page.locator("#rentals")).to_contain_text(f"dispute {dispute_id} (open)")
    expect(page.get_by_role("link", name=f"Dispute rental {grid.rental}")).to_have_count(0)
    shot(page, "workload-links-its-dispute")

    nav(page, "Disputes").click()
    expect(page.locator("#disputes tbody tr")).to_have_count(1)
    expect(page.locator("#disputes tbody")).to_contain_text(grid.rental)
    assert grid.others not in page.content()
    shot(page, "renter-disputes")

    nav(page, "Billing").click()
    expect(page.locator("#billing-disputes")).to_contain_text(f"{dispute_id} of rental {grid.rental}: open, 2.25 USD held")
    shot(page, "billing-disputes")
    page.get_by_label("Rental to dispute").fill(grid.old)  # ended 8 days ago
    page.get_by_role("button", name="Continue").click()
    expect(page.locator("#closed")).to_contain_text("within 7 days of its end")
    expect(page.locator("#dispute-form")).to_have_count(0)
    shot(page, "window-closed")
    answer = post_form(page, grid.url, "/console/disputes", {"rental": grid.old, "reason": "late"})  # the form anyway
    assert answer.status == 409 and "within 7 days of its end" in answer.text()
    assert len(grid.run(grid.services.disputes.list_disputes(owner="rita", role="renter"))) == 1


def test_a_provider_answers_a_dispute_about_its_host_and_not_anothers(grid, browser, page, sign_in, shot):
    dispute_id = open_dispute(grid, grid.rental)
    sign_in(page, "provider")
    nav(page, "Disputes").click()
    page.get_by_role("link", name=dispute_id).click()
    expect(page.locator("#reason")).to_have_text("it crashed after an hour")
    expect(page.locator("#resolve-form")).to_have_count(0)
    page.get_by_role("button", name="Send the answer").click()  # empty
    expect(page.locator("#answer-error")).to_contain_text("must say why")
    page.get_by_label("Your side").fill("The renter's job ran out of memory; the GPU fault came after it exited.")
    page.get_by_role("button", name="Send the answer").click()
    expect(page.locator(".flashes")).to_contain_text(f"Your answer to dispute {dispute_id} is recorded")
    expect(page.locator("#dispute-state")).to_have_text("answered")
    expect(page.locator("#answer")).to_contain_text("ran out of memory")
    shot(page, "provider-answered")

    other = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        bolt = other.new_page()
        sign_in_account(bolt, grid.url, "bolt", OTHERS["bolt"][1])
        nav(bolt, "Disputes").click()
        expect(bolt.locator("#no-disputes")).to_be_visible()
        assert bolt.goto(f"{grid.url}/console/disputes/{dispute_id}").status == 404
        answer = post_form(bolt, grid.url, f"/console/disputes/{dispute_id}/answer", {"answer": "not mine"})
        assert answer.status == 404
        assert bolt.goto(f"{grid.url}/console/disputes/new?rental={grid.rental}").status == 403  # a provider opens none
        assert post_form(bolt, grid.url, "/console/disputes", {"rental": grid.rental, "reason": "x"}).status == 403
        shot(bolt, "another-provider-refused")
    finally:
        other.close()
    rec = grid.run(grid.services.disputes.get(dispute_id, owner=None, role="operator"))
    assert rec.answer.startswith("The renter's job ran out of memory")


def test_the_operator_reads_the_evidence_refuses_bad_amounts_and_refunds_part_once(grid, browser, page, sign_in, shot):
    dispute_id = open_dispute(grid, grid.rental)
    grid.run(grid.services.disputes.answer(dispute_id, "not our fault", owner="acme", role="provider"))
    sign_in(page, "operator")
    nav(page, "Disputes").click()
    expect(page.locator("#state")).to_have_value("unresolved")
    page.get_by_role("link", name=dispute_id).click()
    bundle = page.locator("#evidence-bundle")
    expect(bundle.locator("#evidence-charges tbody")).to_contain_text(f"{grid.rental}: 1 h on agt-a1")
    expect(bundle).to_contain_text("Xid 79: fell off the bus")
    expect(bundle).to_contain_text("container.exited")
    expect(page.locator("#answer-form")).to_have_count(0)  # the provider's side, not the operator's
    shot(page, "operator-evidence")

    before = balances(grid)
    form = page.locator("#resolve-form")
    for resolution, amount, says in [
        ("partial", "-1", "Amount must be more than 0, not -1"),
        ("partial", "lots", "Amount: 'lots' is not an amount"),
        ("partial", "0.0000001", "Amount: "),
        ("partial", "5", "at most what is held (2.25), not 5.00"),
        ("partial", "", "A partial refund names its amount"),
        ("full", "1", "A full refund takes no amount"),
    ]:
        form.get_by_role("radio", name=f"{resolution.capitalize()} refund").check()
        form.get_by_label("Amount to refund").fill(amount)
        form.get_by_role("button", name="Resolve the dispute").click()
        expect(page.locator("#amount-error")).to_contain_text(says)
    shot(page, "amount-refused")
    assert balances(grid) == before  # nothing moved
    answer = post_form(
        page, grid.url, f"/console/disputes/{dispute_id}/resolution", {"resolution": "partial", "amount": "1"}, token=False
    )
    assert answer.status == 403 and "CSRF token is missing or wrong" in answer.text()
    assert balances(grid) == before

    form.get_by_role("radio", name="Partial refund").check()
    form.get_by_label("Amount to refund").fill("1.00")
    form.get_by_label("Note").fill("The host faulted in the last minutes: half of the last hour back.")
    form.get_by_role("button", name="Resolve the dispute").click()
    expect(page.locator(".flashes")).to_contain_text(
        f"Dispute {dispute_id} resolved (partial): 1.00 USD refunded to rita, 1.25 USD released to acme"
    )
    expect(page.locator("#refunded")).to_have_text("1.00 USD")
    expect(page.locator("#released")).to_have_text("1.25 USD")
    expect(page.locator("#resolve-form")).to_have_count(0)
    shot(page, "resolved")
    after = balances(grid)
    assert after[renter_account("rita")] == before[renter_account("rita")] + 1_000_000
    assert after[provider_account("acme")] == before.get(provider_account("acme"), 0) + 1_250_000
    assert after.get(dispute_account(dispute_id), 0) == 0 and sum(after.values()) == 0
    assert ("POST", "/console/disputes/{dispute_id}/resolution", dispute_id) in audited(grid, "operator")
    again = post_form(page, grid.url, f"/console/disputes/{dispute_id}/resolution", {"resolution": "full"})
    assert again.status == 409 and "already resolved (partial)" in again.text()
    assert balances(grid) == after

    nav(page, "Disputes").click()
    expect(page.locator("#no-disputes")).to_be_visible()  # none left to resolve
    page.locator("#state").select_option("resolved")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#disputes tbody")).to_contain_text("partial: 1.00 refunded, 1.25 released")
    shot(page, "resolved-list")

    renter = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        rita = renter.new_page()
        sign_in_account(rita, grid.url, "rita", "renter-password-1")
        rita.goto(f"{grid.url}/console/disputes/{dispute_id}")
        expect(rita.locator("#outcome")).to_contain_text("Outcome: partial refund")
        expect(rita.locator("#note")).to_contain_text("half of the last hour back")
        shot(rita, "renter-sees-outcome")
    finally:
        renter.close()


def test_a_renter_cannot_dispute_anothers_rental_nor_resolve_and_a_form_needs_its_csrf_token(grid, page, sign_in, shot):
    dispute_id = open_dispute(grid, grid.rental)
    before = balances(grid)
    sign_in(page, "renter")
    assert page.goto(f"{grid.url}/console/disputes/new?rental={grid.others}").status == 404
    expect(page.locator("main")).to_contain_text(f"no rental '{grid.others}'")
    shot(page, "anothers-rental")
    assert post_form(page, grid.url, "/console/disputes", {"rental": grid.others, "reason": "mine now"}).status == 404
    resolved = post_form(page, grid.url, f"/console/disputes/{dispute_id}/resolution", {"resolution": "full"})
    assert resolved.status == 403 and "may not write dispute resolutions" in resolved.text()
    answered = post_form(page, grid.url, f"/console/disputes/{dispute_id}/answer", {"answer": "me too"})
    assert answered.status == 403
    no_token = post_form(page, grid.url, "/console/disputes", {"rental": grid.rental, "reason": "again"}, token=False)
    assert no_token.status == 403 and "CSRF token is missing or wrong" in no_token.text()
    assert page.goto(f"{grid.url}/console/completion-review").status == 403
    assert balances(grid) == before
    assert grid.run(grid.services.disputes.get(dispute_id, owner=None, role="operator")).state == "open"
    assert grid.run(grid.services.disputes.list_disputes(owner="otto", role="renter")) == []


def test_the_operator_clears_a_host_held_for_completion_review_and_a_provider_cannot(grid, browser, page, sign_in, shot):
    async def failing_host() -> None:  # 5 more rentals on agt-a1, 2 ended through it: 6 of 8 is 75 %, under 80 %
        for n in range(5):
            failure = "agt-a1: went offline" if n < 2 else ""
            await ended_rental(grid, f"wl-c{n}-a1", f"wl-c{n}", host_failure=failure, charge=0)
        await grid.services.market.market.reliability.refresh()

    grid.run(failing_host())
    provider = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        acme = provider.new_page()
        sign_in_account(acme, grid.url, "acme", "provider-password-1")
        assert acme.goto(f"{grid.url}/console/completion-review").status == 403
        assert post_form(acme, grid.url, "/console/hosts/agt-a1/completion-review", {}).status == 403
        acme.goto(f"{grid.url}/console/hosts/agt-a1")
        expect(acme.locator("#host-completion")).to_contain_text("under review")
        expect(acme.locator("#clear-review")).to_have_count(0)
    finally:
        provider.close()
    assert grid.services.market.completion("agt-a1", owner=None).under_review

    sign_in(page, "operator")
    page.goto(f"{grid.url}/console/hosts/agt-a1")  # the host's own page offers the same clearing
    expect(page.locator("#clear-review")).to_be_visible()
    expect(page.locator("#host-completion")).to_contain_text("75% of 8 rentals")
    shot(page, "host-page-under-review")
    nav(page, "Completion review").click()
    row = page.locator("#held-agt-a1")
    expect(row).to_contain_text("75%")
    expect(row).to_contain_text("host failure 2")
    shot(page, "held-for-review")
    row.get_by_role("button", name="Clear agt-a1: offer it again").click()
    expect(page.locator(".flashes")).to_contain_text("Host agt-a1 reviewed (it had 75% of 8 rentals). It is offered again")
    expect(page.locator("#none-held")).to_be_visible()
    shot(page, "review-cleared")
    assert not grid.services.market.completion("agt-a1", owner=None).under_review


def test_the_operators_unresolved_disputes_are_found_past_hundreds_of_newer_resolved_ones_page_by_page(grid, page, sign_in, shot):
    """The state is filtered by the store, not among the newest few hundred read: 230 resolved disputes newer than 55
    open ones, and the operator's list (unresolved by default) shows the open ones, 50 a page, each once."""
    from management.payments.disputes import DisputeRecord, DisputeState, Evidence
    from management.store import dispute_repo

    repo = dispute_repo(grid.server.master.store)
    now = time.time()

    async def seed() -> None:
        for n in range(285):
            state: DisputeState = "open" if n < 55 else "resolved"
            await repo.put(DisputeRecord(
                id=f"dsp-{n:04d}", rental_id=f"wl-s{n}-a1", workload_id=f"wl-s{n}", account="rita", agent_id="agt-a1",
                provider="acme", reason="seeded", created_at=now - 10_000 + n, disputable=1, held=1, fee=0,
                evidence=Evidence(started_at=now - 20_000, ended_at=now - 10_000, seconds=3600), state=state,
            ))  # fmt: skip

    grid.run(seed())
    sign_in(page, "operator")
    nav(page, "Disputes").click()
    page.wait_for_load_state("load")
    expect(page.locator("#state")).to_have_value("unresolved")
    rows = page.locator("#disputes tbody tr")
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text("dsp-0054")  # the newest open one, past 230 newer resolved
    shot(page, "operator-unresolved-page-1")
    seen = rows.locator("td:first-child").all_inner_texts()
    page.locator("#disputes-older").click()
    page.wait_for_load_state("load")
    expect(rows).to_have_count(5)
    expect(page.locator("#disputes-older")).to_have_count(0)
    seen += rows.locator("td:first-child").all_inner_texts()
    assert seen == [f"dsp-{n:04d}" for n in range(54, -1, -1)]
    assert all(s == "open" for s in rows.locator(".state").all_inner_texts())
    shot(page, "operator-unresolved-page-2")
    page.locator("#disputes-newest").click()
    page.wait_for_load_state("load")
    expect(rows.first).to_contain_text("dsp-0054")

    page.goto(page.url.split("?")[0] + "?state=")  # every state: the newest first, the resolved ones
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text("dsp-0284")
    page.locator("#disputes-older").click()
    page.wait_for_load_state("load")
    expect(rows.first).to_contain_text("dsp-0234")  # the cursor kept "every state", not the operator's default
    # a cursor issued for one state, sent with another: refused, saying so
    older = page.locator("#disputes-older").get_attribute("href")
    answer = page.request.get(page.url.split("?")[0] + older.replace("state=&", "state=resolved&"))
    assert answer.status == 400 and "cursor" in answer.text()
