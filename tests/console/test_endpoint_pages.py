"""A renter's endpoints in the console, in Debian's Chromium against a real Master (docs/endpoints.md, "The console"):
the list, an endpoint's page (its worker, scaling, how to call it), an invocation key made (shown once, and the key
that was shown works: ``authorize_invocation`` lets it call this endpoint), revoked after a confirmation (then refused),
and another renter's endpoint answering 404.

The host is simulated (no GPU here): it is there so the endpoint's worker spec could run on this grid, which creating
an endpoint checks."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from management.endpoints.spec import EndpointScaling, EndpointSpec
from management.services.endpoints import InvocationRefused
from master.port import ReplicaSpec, WorkerError, WorkerRef
from master.records import AccountRecord
from tests.management.hosts import add_agent
from tests.support.grid import wait_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_renter_reads_its_endpoint_makes_a_key_shown_once_and_revokes_it(console_master, page, sign_in, shot):
    services = console_master.services
    console_master.run(
        add_agent(console_master.server.master, "agt-sim", "a10:2", provider="acme", runtime="docker", isolation="container")
    )
    spec = EndpointSpec(
        name="echo",
        image="ghcr.io/acme/echo:1",
        command=["python", "handler.py"],
        env={"HF_TOKEN": "hf_secret_value"},
        replica=ReplicaSpec(gpus=1),
        scaling=EndpointScaling(min_workers=0, max_workers=4, concurrency=2),
    )
    made = console_master.run(services.endpoints.create("rita", spec))
    console_master.run(console_master.server.master.accounts.create(AccountRecord(id="otto", role="renter")))
    others = console_master.run(services.endpoints.create("otto", EndpointSpec(name="theirs", image="ghcr.io/o/x:1")))

    sign_in(page, "renter")
    page.get_by_role("link", name="Endpoints").click()
    table = page.locator("#endpoints")
    expect(table.get_by_role("link", name="echo")).to_be_visible()  # waits for the list (the click returns before it)
    assert "0 to 4" in table.inner_text() and "theirs" not in page.content()
    shot(page, "endpoints")

    table.get_by_role("link", name="echo").click()
    page.wait_for_url(f"**/console/endpoints/{made.id}")
    page.wait_for_load_state("load")  # the whole page, not the part parsed when the click returned (CI read half)
    body = page.locator("main").inner_text()
    assert made.id in body and "ghcr.io/acme/echo:1" in body and "python handler.py" in body
    assert "HF_TOKEN" in body and "hf_secret_value" not in page.content()  # names only
    assert f"/api/v1/endpoints/{made.id}/run" in body
    expect(page.locator("#no-keys")).to_be_visible()

    page.get_by_label("Name of a new key").fill("x" * 101)
    page.get_by_role("button", name="Make a key").click()
    expect(page.locator("#name-error")).to_contain_text("100 characters at most")
    page.get_by_label("Name of a new key").fill("my-app")
    page.get_by_role("button", name="Make a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    key = page.locator("#issued-key").inner_text().strip()
    assert key.startswith("igek_") and "shown on this page once" in page.locator("#issued").inner_text()
    shot(page, "key-made")
    invocation = console_master.run(services.endpoints.authorize_invocation(made.id, key))
    assert invocation.key.name == "my-app"

    page.goto(f"{console_master.url}/console/endpoints/{made.id}")
    assert key not in page.content()  # never shown again
    page.get_by_role("link", name="Revoke key my-app").click()
    shot(page, "revoke-confirm")
    page.get_by_role("button", name="Revoke the key").click()
    expect(page.locator(".flashes")).to_contain_text("Revoked invocation key my-app")
    assert "revoked" in page.locator("#keys").inner_text()
    with pytest.raises(InvocationRefused):
        console_master.run(services.endpoints.authorize_invocation(made.id, key))
    shot(page, "revoked")

    answer = page.goto(f"{console_master.url}/console/endpoints/{others.id}")
    assert answer is not None and answer.status == 404  # another renter's endpoint is not there for this one


def test_a_load_balanced_endpoint_shows_its_mode_and_its_url(console_master, page, sign_in, shot):
    services = console_master.services
    console_master.run(
        add_agent(console_master.server.master, "agt-sim", "a10:2", provider="acme", runtime="docker", isolation="container")
    )
    spec = EndpointSpec(name="llm", image="ghcr.io/acme/vllm:1", mode="load_balanced", http_port=8080, readiness_path="/ready")
    made = console_master.run(services.endpoints.create("rita", spec))
    console_master.run(services.endpoints.create("rita", EndpointSpec(name="echo", image="ghcr.io/acme/echo:1")))
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/endpoints")
    rows = {row.split()[0]: row for row in page.locator("#endpoints tbody").inner_text().splitlines()}
    assert "load-balanced" in rows["llm"] and "queue" in rows["echo"]
    page.get_by_role("link", name="llm").click()
    page.wait_for_url(f"**/console/endpoints/{made.id}")
    url = services.links.endpoint_url(made.id)
    assert page.locator("#endpoint-url").inner_text() == url and url.endswith(f"/e/{made.id}/")
    assert "port 8080" in page.locator("#endpoint-mode").inner_text() and "/ready" in page.locator("#endpoint-mode").inner_text()
    assert f"/api/v1/endpoints/{made.id}/run" not in page.locator("main").inner_text()  # no queue routes to call
    assert page.locator("#now-queue").inner_text().startswith("0 held for a ready worker")
    shot(page, "load-balanced")


def test_an_endpoints_page_shows_its_workers_queue_latest_requests_and_cost(console_master, page, sign_in, shot):
    """The live parts: the request book's and the autoscaler's view. A worker is played through the book's worker calls
    (no agent runs here); the autoscaler's shell ticks as it does on any Master."""
    services = console_master.services
    console_master.run(
        add_agent(console_master.server.master, "agt-sim", "a10:2", provider="acme", runtime="docker", isolation="container")
    )
    spec = EndpointSpec(name="echo", image="ghcr.io/acme/echo:1", scaling=EndpointScaling(max_workers=2), daily_spend_cap="5.00")
    made = console_master.run(services.endpoints.create("rita", spec))
    book = dict(console_master.server.composition.state)["endpoint requests"]
    sent = [console_master.run(services.endpoint_requests.run(made.id, {"n": n}, account="rita")) for n in range(3)]
    worker = WorkerRef(made.id, "wk-played", "agt-sim")

    async def work_one() -> None:
        taken = await book.take(worker, 0)
        assert taken is not None and taken.id == sent[0].id
        await book.result(worker, taken.id, {"ok": True})
        failing = await book.take(worker, 0)
        assert failing is not None
        await book.error(worker, failing.id, WorkerError("ValueError", "bad input"))

    console_master.run(work_one())
    # The autoscaler's shell looks at the endpoint within a tick (a second) of its making.
    wait_for(lambda: services.endpoints.scale_of(made.id) is not None, 10, "the autoscaler's first tick")
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/endpoints/{made.id}")
    now = page.locator("#now").inner_text()
    assert "1 waiting" in page.locator("#now-queue").inner_text()
    assert "1 completed, 1 failed" in page.locator("#now-cost").inner_text()
    assert "Daily spend cap" in now and "5.00" in now
    rows = page.locator("#latest tbody tr").all_inner_texts()
    assert [r.split("\t")[0] for r in rows] == [s.id for s in reversed(sent)]  # newest first
    assert "completed" in rows[2] and "failed" in rows[1] and "ValueError bad input" in rows[1] and "queued" in rows[0]
    assert page.locator("#now-decision").inner_text()  # the autoscaler's line: why it started or stopped workers
    assert "none yet" not in page.locator("#now-workers").inner_text()
    # The played worker is no workload of this Master and the one asked for has not called yet: no cold start to show.
    assert "no worker started yet on this Master" in page.locator("#now-cold").inner_text()
    shot(page, "live")
