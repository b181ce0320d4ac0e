"""Templates and links in the console, on a running grid, in Debian's Chromium (docs/templates.md, docs/links.md):
a renter launches a template from the templates page, sees its link on the workload's page, opens it in a new tab
(a Jupyter-like app whose page talks to its kernel over a WebSocket, through the Master, the relay and the agent's
tunnel) and sees the echo; another renter gets nothing from the same link. A screenshot of each step.

A real Master, relay and agent, each its own process (tests/support/grid.py); the host runs the process runtime
sandboxed and its GPU is simulated (there is none here). The app is tests/support/link_app.py on Debian's
python3-aiohttp, offered by the operator's own template directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from management.client.api import ApiClient
from tests.console.conftest import ACCOUNTS
from tests.e2e.test_links import app_workload, notebook_template
from tests.e2e.test_scheduler import MASTER_SETTINGS, sandboxed_hosts, wait_workload
from tests.support.grid import TEST_PROVIDER, Grid, free_port, write_toml

pytestmark = pytest.mark.e2e

PRICE = {"on_demand": "3.60", "min_bid": "1.00"}
BOB = ("bob", "bob-password-1")


@pytest.fixture
def drop() -> Iterator[Path]:
    """A directory every sandboxed container may read (as tests/e2e/conftest.py's ``drop``): not under /tmp, which each
    sandboxed container gets fresh, nor under pytest's root-only tree."""
    path = Path(tempfile.mkdtemp(prefix="idlegrid-links-drop-", dir="/run"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def grid(tmp_path: Path, drop: Path) -> Iterator[Grid]:
    templates = notebook_template(tmp_path / "templates", drop, free_port())
    g = Grid(tmp_path / "grid")
    try:
        settings = {**MASTER_SETTINGS, "templates_dir": str(templates)}
        g.start_master("--config", str(write_toml(tmp_path / "master.toml", settings)))
        g.start_relay("relay-1", "eu-west")
        rita = ACCOUNTS["renter"]
        for account, password, name in ((rita.id, rita.password, rita.name), (*BOB, "Bob")):
            g.client.create_account(account, "renter", name=name)
            g.client.set_password(account, password)
            g.client.credit(account, "10.00", memo="links journey")
        sandboxed_hosts(g, 1)
        g.client.set_default_price(PRICE, provider=TEST_PROVIDER)
        yield g
    finally:
        g.stop()


def sign_in(page, grid: Grid, account: str, password: str) -> None:
    page.goto(f"{grid.api_url}/console/")
    page.get_by_label("Account").fill(account)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/console/signin" not in url)


def launch_notebook(page, name: str, before_launch=lambda: None) -> str:
    """From the console's templates page (signed in): the test app's template launched, its workload running; its id."""
    card = page.get_by_role("region", name="Notebook (test app)")
    card.get_by_label("Name").fill(name)
    before_launch()
    card.get_by_role("button", name="Launch Notebook (test app)").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    expect(page.locator("#workload-state")).to_have_text("running", timeout=30_000)
    return page.url.rsplit("/", 1)[1]


def open_link(page):
    """The workload page's "Open port" link clicked: the new tab, once the app answers there."""
    opener = page.get_by_role("region", name="Links").get_by_role("link", name=re.compile("Open port"))
    assert opener.get_attribute("target") == "_blank"
    with page.context.expect_page() as opened:
        opener.click()
    tab = opened.value
    # The app may still be starting when the workload runs: the page reloads until it answers.
    for _ in range(30):
        tab.wait_for_load_state()
        if tab.get_by_role("heading", name="Notebook server (test app)").count():
            break
        tab.wait_for_timeout(1000)
        tab.reload()
    return tab


def test_a_template_launches_from_the_console_and_its_private_link_opens_with_a_websocket_for_its_owner_only(
    grid, browser, page, shot
):
    rita = ACCOUNTS["renter"]
    sign_in(page, grid, rita.id, rita.password)
    page.get_by_role("link", name="Templates").click()
    page.wait_for_url(re.compile(r"/console/templates$"))
    for title in ("PyTorch with Jupyter", "CUDA shell", "vLLM: an OpenAI-compatible model server", "ComfyUI"):
        expect(page.get_by_role("heading", name=title)).to_be_visible()
    page.set_viewport_size({"width": 375, "height": 800})  # a phone: the cards stack, nothing scrolls sideways
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "templates-375px")
    page.set_viewport_size({"width": 1280, "height": 860})
    workload_id = launch_notebook(page, "notebook-1", lambda: shot(page, "templates"))
    links = page.get_by_role("region", name="Links")
    expect(links).to_contain_text(f"{grid.links_url}/w/{workload_id}-")  # the links' own origin, not the console's
    expect(links).to_contain_text("private: you only")
    shot(page, "workload-with-its-link")

    tab = open_link(page)
    expect(tab.locator("#echo")).to_have_text("echo: ping from the browser", timeout=20_000)
    assert tab.url.startswith(f"{grid.links_url}/w/{workload_id}-") and "idlegrid_token" not in tab.url  # now a cookie
    shot(tab, "link-open-websocket-echoed")
    link_url = tab.url

    stranger = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        bob = stranger.new_page()
        answer = bob.goto(link_url)
        assert answer is not None and answer.status == 401
        expect(bob.locator("body")).to_contain_text("this link is private")
        shot(bob, "a-stranger-is-refused")
        sign_in(bob, grid, *BOB)
        answer = bob.goto(link_url)  # signed in to the console as another account: still nothing
        assert answer is not None and answer.status == 401
        port = link_url.rstrip("/").rsplit("-", 1)[1]
        answer = bob.goto(f"{grid.api_url}/console/workloads/{workload_id}/links/{port}")
        assert answer is not None and answer.status == 404
        shot(bob, "another-account-gets-404")
    finally:
        stranger.close()


def probe_the_console(tab, link_url: str, console_url: str) -> dict:
    """The test app's hostile page (``/probe``) opened in ``tab`` on the link: what its script got from the console."""
    tab.goto(f"{link_url}probe?console={console_url}")
    expect(tab.locator("#probe")).not_to_have_text("running", timeout=20_000)
    return json.loads(tab.locator("#probe").inner_text())


def assert_nothing_read_nor_done(got: dict) -> None:
    assert got["own"] == 200  # the script ran, and reads its own origin
    assert got["read"] == "blocked: TypeError"  # the console's page (and its CSRF token) are not shown to it
    assert got["opaque"] == "opaque 0"  # without CORS: an empty, opaque answer
    assert got["post"] == "sent"  # it went, with the console's cookie; the console refused it (another Origin)


def test_a_private_links_page_cannot_read_the_console_of_its_owner_or_an_operator_nor_act_there(grid, browser, page, shot):
    """The link's page is the renter's image's: it runs on the links' origin (another port of the same host), so the
    browser sends it the console's cookie (cookies ignore ports) but shows it no console answer (CORS), and the
    console refuses its writes (another Origin, no CSRF token). An operator, who may open any private link, is no
    more exposed than its owner. And the console's own origin serves no link."""
    rita, operator = ACCOUNTS["renter"], ACCOUNTS["operator"]
    sign_in(page, grid, rita.id, rita.password)
    page.goto(f"{grid.api_url}/console/templates")
    workload_id = launch_notebook(page, "probe-1")
    tab = open_link(page)
    link_url = tab.url  # .../w/<workload>-<port>/, signed in there by the link's cookie
    assert link_url.startswith(f"{grid.links_url}/w/{workload_id}-")
    keys_before = grid.client.get(f"/api/v1/accounts/{rita.id}/keys")["items"]

    got = probe_the_console(tab, link_url, grid.api_url)
    shot(tab, "link-page-probing-the-console")
    assert_nothing_read_nor_done(got)
    keys_after = grid.client.get(f"/api/v1/accounts/{rita.id}/keys")["items"]
    assert keys_after == keys_before and not any(k["name"] == "stolen-by-a-link" for k in keys_after)
    account = page.goto(f"{grid.api_url}/console/account")  # rita's console session was live all along
    assert account is not None and account.status == 200 and 'name="csrf_token"' in page.content()

    # The console's session is no key to a link, even sent there on purpose (its path, /console, keeps it away).
    [session] = [c for c in page.context.cookies() if c["name"] == "idlegrid_console"]
    bare = browser.new_context()
    try:
        answer = bare.request.get(link_url, headers={"Cookie": f"idlegrid_console={session['value']}"})
        assert answer.status == 401 and "this link is private" in answer.text()
    finally:
        bare.close()

    grid.client.set_password(operator.id, operator.password)
    operators = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        olga = operators.new_page()
        sign_in(olga, grid, operator.id, operator.password)
        port = link_url.rstrip("/").rsplit("-", 1)[1]
        olga.goto(f"{grid.api_url}/console/workloads/{workload_id}/links/{port}")  # the console's opener, as operator
        assert olga.url == link_url
        operator_keys = grid.client.get(f"/api/v1/accounts/{operator.id}/keys")["items"]
        assert_nothing_read_nor_done(probe_the_console(olga, link_url, grid.api_url))
        shot(olga, "an-operator-opens-the-probe")
        assert grid.client.get(f"/api/v1/accounts/{operator.id}/keys")["items"] == operator_keys
    finally:
        operators.close()

    # The console's origin never serves the link: a link's path there is only a redirect to the links' origin.
    path = link_url.removeprefix(grid.links_url)
    moved = page.request.get(f"{grid.api_url}{path}probe", max_redirects=0)
    assert moved.status == 308 and moved.headers["location"] == f"{link_url}probe"
    assert "Probe" not in moved.text() and "Notebook" not in moved.text()
    answer = page.goto(f"{grid.api_url}{path}")
    assert answer is not None and page.url == link_url  # followed to the link's own origin, where it opens
    expect(page.get_by_role("heading", name="Notebook server (test app)")).to_be_visible()


def test_a_public_links_page_cannot_sign_its_visitor_in_to_the_console_as_the_links_owner(grid, drop, browser, page, shot):
    """Bob's public link answers with Set-Cookie headers for the console's cookie (his own console session, at
    /console, at /, at a longer path, with a Domain): cookies ignore ports, so a browser would take them for the
    console's. Rita, signed in to the console, opens the link; afterwards she is still Rita there, and only the app's
    cookie of its own path was kept. Nor is the app sent the console's cookie when a browser has one at / (as the
    ``__Host-`` cookie is, over https)."""
    rita = ACCOUNTS["renter"]
    bob = ApiClient(grid.api_url, grid.client.create_api_key(BOB[0], "e2e")["key"])
    spec, _ = app_workload(drop, "bobs-public", public=True)
    workload_id = bob.submit_workload(spec)["id"]
    wait_workload(bob, workload_id, "running", lambda w: w["state"] == "running", timeout=30)
    [link] = bob.workload_links(workload_id)["items"]
    assert link["public"] is True and link["url"].startswith(f"{grid.links_url}/w/{workload_id}-")

    bobs_browser = browser.new_context()
    try:
        bobs_page = bobs_browser.new_page()
        sign_in(bobs_page, grid, *BOB)
        [bobs_session] = [c["value"] for c in bobs_browser.cookies() if c["name"] == "idlegrid_console"]
    finally:
        bobs_browser.close()

    sign_in(page, grid, rita.id, rita.password)
    expect(page.locator("header")).to_contain_text(f"Signed in as {rita.name}")
    shot(page, "rita-signed-in")
    planted = f"{link['url']}plant?value={quote(bobs_session, safe='')}"
    for _ in range(30):  # the app may still be starting when the workload runs
        answer = page.goto(planted)
        if answer is not None and answer.status == 200:
            break
        page.wait_for_timeout(1000)
    expect(page.get_by_role("heading", name="Cookies planted")).to_be_visible()
    shot(page, "bobs-public-link-tried-to-plant-his-session")

    cookies = {(c["name"], c["path"]): c["value"] for c in page.context.cookies()}
    assert not [v for v in cookies.values() if bobs_session.strip('"') in v], cookies  # none of Bob's session
    assert [key for key in cookies if key[0] == "idlegrid_console"] == [("idlegrid_console", "/console")]
    prefix = link["url"].removeprefix(grid.links_url)
    assert cookies.get(("app_own", prefix.rstrip("/"))) == "1"  # the link's own cookie: the browser took its answer
    assert not {"app_root", "theme"} & {name for name, _ in cookies}

    page.goto(f"{grid.api_url}/console/account")
    expect(page.locator("header")).to_contain_text(f"Signed in as {rita.name}")
    expect(page.locator("main")).to_contain_text(rita.id)
    expect(page.locator("body")).not_to_contain_text("Bob")
    shot(page, "rita-is-still-rita-in-the-console")

    # A console cookie at / (its path over https) goes to the links' listener too, but never on to the container.
    secure_like = browser.new_context()
    try:
        secure_like.add_cookies(
            [
                {"name": "idlegrid_console", "value": "ritas-session", "domain": "127.0.0.1", "path": "/"},
                {"name": "theme", "value": "light", "domain": "127.0.0.1", "path": "/"},
            ]
        )
        visitor = secure_like.new_page()
        visitor.goto(f"{link['url']}api/headers")
        seen = json.loads(visitor.locator("body").inner_text())
        assert seen["cookie"] == "theme=light"  # the app's own kind of cookie passes; ours does not
        shot(visitor, "what-the-container-was-sent")
    finally:
        secure_like.close()
