"""HTTPS links on a real local grid (docs/links.md): a Master, a relay and an agent, each its own process; the host
runs the process runtime sandboxed, and a Jupyter-like aiohttp app (tests/support/link_app.py, on Debian's
python3-aiohttp) is the workload's command. Requests reach it through the Master's link, the relay and the agent's
tunnel: pages, streamed bodies both ways, a WebSocket; private links refuse strangers and other accounts.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from management.client.api import ApiClient, ApiRequest
from tests.e2e.test_scheduler import MASTER_SETTINGS, renter, sandboxed_hosts, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, Grid, free_port, running_grid, wait_for, write_toml

pytestmark = pytest.mark.e2e

APP = Path(__file__).resolve().parents[1] / "support" / "link_app.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")


def needs_system_aiohttp() -> None:
    import subprocess

    if subprocess.run([str(SYSTEM_PYTHON), "-c", "import aiohttp"], capture_output=True).returncode != 0:
        pytest.fail("Debian's python3-aiohttp is needed (scripts/setup-env --test installs it): the sandboxed app runs on it")


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def app_workload(drop: Path, name: str, *, public: bool = False) -> tuple[dict[str, Any], int]:
    """The test app as a workload: its port declared and linked (http), private unless ``public``."""
    needs_system_aiohttp()
    shutil.copy(APP, drop / "link_app.py")
    port = free_port()
    spec = workload(
        name,
        f"exec {SYSTEM_PYTHON} {drop / 'link_app.py'} {port}",
        ports=[port],
        links=[{"port": port, "kind": "http", "public": public}],
    )
    return spec, port


@pytest.fixture
def linked(grid: Grid, drop: Path) -> tuple[ApiClient, ApiClient, str, str]:
    """alice's running app with a private link; bob, another renter; (alice, bob, workload id, link URL)."""
    sandboxed_hosts(grid, 1)
    alice, bob = renter(grid, "alice"), renter(grid, "bob")
    spec, port = app_workload(drop, "notebook")
    workload_id = alice.submit_workload(spec)["id"]
    wait_workload(alice, workload_id, "running", lambda w: w["state"] == "running", timeout=30)
    [link] = alice.workload_links(workload_id)["items"]
    # On the links' own listener: never the API's and the console's origin (docs/links.md).
    assert link == {"port": port, "url": f"{grid.links_url}/w/{workload_id}-{port}/", "public": False}
    return alice, bob, workload_id, link["url"]


async def fetch(url: str, key: str | None = None, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers, allow_redirects=False, **kwargs) as answer:
            return answer.status, dict(answer.headers), await answer.read()


def until_served(url: str, key: str) -> bytes:
    """The app's first answer through the link (the app may still be starting when the workload is running)."""
    return wait_for(lambda: (got := asyncio.run(fetch(url, key)))[0] == 200 and got[2], 30, f"{url} through its link")


def test_the_owner_opens_the_page_and_the_websocket_echoes_through_the_link(linked):
    alice, _, _, url = linked
    assert b"Notebook server (test app)" in until_served(url, alice.api_key)

    async def echo() -> list[str]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {alice.api_key}"}) as session:
            async with session.ws_connect(url + "api/kernels/echo") as socket:
                got = []
                for text in ("one", "two" * 30_000):
                    await socket.send_str(text)
                    got.append((await socket.receive(timeout=10)).data)
                await socket.send_bytes(b"\x00\x01binary")
                got.append((await socket.receive(timeout=10)).data.decode("latin-1"))
                return got

    assert asyncio.run(echo()) == ["one", "two" * 30_000, "\x00\x01binary"]


def test_bodies_stream_both_ways_and_the_container_never_sees_our_credentials(grid, linked):
    alice, _, _, url = linked
    until_served(url, alice.api_key)

    async def run() -> tuple[Any, Any, Any]:
        headers = {"Authorization": f"Bearer {alice.api_key}", "Cookie": "idlegrid_console=secret; theirs=kept"}
        async with aiohttp.ClientSession(headers=headers) as session:
            size = 20 * 1024 * 1024

            async def body():  # chunked: the proxy streams it, never holding it whole
                for _ in range(size // 65536):
                    yield b"y" * 65536

            async with session.post(url + "api/upload", data=body()) as up:
                uploaded = await up.json()
            async with session.get(url + f"api/bytes?n={size}") as down:
                downloaded = len(await down.read())
            async with session.get(url + "api/headers?x=1") as seen:
                return uploaded, downloaded, await seen.json()

    uploaded, downloaded, seen = asyncio.run(run())
    assert uploaded == {"received": 20 * 1024 * 1024} and downloaded == 20 * 1024 * 1024
    assert "authorization" not in seen
    assert seen["cookie"] == "theirs=kept"  # the console's cookie (and the link's) stay with the Master
    assert seen[":path"] == "/api/headers?x=1"  # the link's prefix is taken off
    assert seen["x-forwarded-prefix"].startswith("/w/wl-")
    # Every request above (and the ones until_served made) rode the link's one tunnel, each connection a stream of it.
    workload_id = url.rsplit("/w/", 1)[1].rsplit("-", 1)[0]
    events = grid.client.get("/api/v1/events", subject=workload_id, kind="tunnel.opened", limit=100)["items"]
    assert [e["data"]["kind"] for e in events] == ["port"] and events[0]["data"]["account"] == "alice"


def test_a_private_link_refuses_strangers_and_other_accounts_and_a_token_becomes_a_cookie(linked):
    alice, bob, workload_id, url = linked
    until_served(url, alice.api_key)
    status, headers, body = asyncio.run(fetch(url))
    assert status == 401 and b"this link is private" in body and "Bearer" in headers["WWW-Authenticate"]
    status, _, body = asyncio.run(fetch(url, bob.api_key))
    assert status == 404 and b"no link" in body
    status, _, _ = asyncio.run(fetch(url, "igl_forged.token"))
    assert status == 401
    # bob cannot mint a token for alice's link; alice can, and it opens only that link.
    port = url.rstrip("/").rsplit("-", 1)[1]
    refused = bob.exchange(ApiRequest("POST", f"/api/v1/workloads/{workload_id}/links/{port}/tokens", body={}))
    assert refused[0] == 404, refused
    minted = alice.mint_link_token(workload_id, int(port), ttl_s=600)
    assert minted["url"] == url and minted["token"].startswith("igl_")

    async def with_token() -> tuple[int, str, int]:
        # unsafe: the grid is on 127.0.0.1, and aiohttp keeps no cookie of an IP address otherwise
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            async with session.get(url + "?idlegrid_token=" + minted["token"], allow_redirects=False) as handed:
                location = handed.headers["Location"]
                cookie = handed.cookies["idlegrid_link"]
            async with session.get(url.rsplit("/w/", 1)[0] + location) as page:
                return handed.status, f"{cookie['path']} {cookie['httponly']}", page.status

    status, cookie, page_status = asyncio.run(with_token())
    assert status == 303 and page_status == 200
    assert cookie == f"/w/{workload_id}-{port}/ True"
    bad = alice.exchange(ApiRequest("POST", f"/api/v1/workloads/{workload_id}/links/{port}/tokens", body={"ttl_s": 10}))
    assert bad[0] == 400 and "ttl_s" in bad[1]["error"]["message"]
    other = alice.exchange(ApiRequest("POST", f"/api/v1/workloads/{workload_id}/links/1/tokens", body={}))
    assert other[0] == 400 and other[1]["error"]["code"] == "invalid_link"


def test_a_public_link_opens_for_anyone_in_a_sandbox_and_redirects_stay_under_the_link(grid, drop):
    sandboxed_hosts(grid, 1)
    alice = renter(grid, "alice")
    spec, port = app_workload(drop, "public-demo", public=True)
    workload_id = alice.submit_workload(spec)["id"]
    wait_workload(alice, workload_id, "running", lambda w: w["state"] == "running", timeout=30)
    [link] = alice.workload_links(workload_id)["items"]
    assert link["public"] is True
    status, headers, body = wait_for(lambda: (got := asyncio.run(fetch(link["url"])))[0] == 200 and got, 30, "the public link")
    assert b"Notebook server" in body
    assert headers["Content-Security-Policy"].startswith("sandbox allow-scripts")  # the Master's origin is not its own
    status, headers, _ = asyncio.run(fetch(link["url"] + "api/moved"))
    assert status == 302 and headers["Location"] == f"/w/{workload_id}-{port}/api/headers"


def notebook_template(directory: Path, drop: Path, port: int) -> Path:
    """An operator's template (the test app on the process runtime), in the Master's ``templates_dir``."""
    needs_system_aiohttp()
    shutil.copy(APP, drop / "link_app.py")
    directory.mkdir(exist_ok=True)
    (directory / "notebook.toml").write_text(
        f"""title = "Notebook (test app)"
description = "The links' test app, a Jupyter stand-in that runs sandboxed on a host."
image = "none"
command = ["{SYSTEM_PYTHON}", "{drop / "link_app.py"}", "{port}"]
allow_process_runtime = true
disk_gib = 1

[[ports]]
port = {port}
kind = "http"
"""
    )
    return directory


def test_a_template_from_the_operators_catalog_launches_from_the_cli_which_prints_its_link(tmp_path, drop):
    templates = notebook_template(tmp_path / "templates", drop, free_port())
    with running_grid(tmp_path / "grid", MASTER_SETTINGS | {"templates_dir": str(templates)}) as grid:
        sandboxed_hosts(grid, 1)
        alice = renter(grid, "alice")
        listed = cli(grid, alice.api_key, "template", "list")
        assert listed.returncode == 0, listed.stderr
        for name in ("comfyui", "cuda-shell", "jupyter", "notebook", "vllm"):
            assert name in listed.stdout
        shown = cli(grid, alice.api_key, "template", "show", "jupyter")
        assert "8888/http" in shown.stdout and "pytorch" in shown.stdout
        unknown = cli(grid, alice.api_key, "template", "show", "nope")
        assert unknown.returncode != 0 and "no template 'nope'" in unknown.stderr

        launched = cli(grid, alice.api_key, "workload", "submit", "--template", "notebook", "--name", "nb", timeout=120)
        assert launched.returncode == 0, launched.stderr
        lines = launched.stdout.splitlines()
        [link_line] = [line for line in lines if line.startswith("link (port")]
        [browser_line] = [line for line in lines if "open in a browser:" in line]
        assert "private" in link_line
        browser_url = browser_line.split("open in a browser: ", 1)[1]
        status, _, body = asyncio.run(fetch_following(browser_url))
        assert status == 200 and b"Notebook server (test app)" in body
        workload_id = lines[0].split()[1]
        shown = cli(grid, alice.api_key, "workload", "get", workload_id)
        assert f"link:        {grid.links_url}/w/{workload_id}-" in shown.stdout


def cli(grid: Grid, key: str, *args: str, timeout: float = 60) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "management.cli", *args, "--api", grid.api_url, "--api-key", key],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def fetch_following(url: str) -> tuple[int, dict[str, str], bytes]:
    """As a browser opens a URL: redirects followed, cookies kept (of 127.0.0.1 too)."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.get(url) as answer:
            return answer.status, dict(answer.headers), await answer.read()


def test_on_a_wildcard_domain_each_link_is_a_host_of_its_own_with_http_and_websockets(tmp_path, drop):
    """``[links] domain``: the Master serves ``<workload>-<port>.<domain>`` by its Host header (a DNS wildcard would
    send every such name to it; here the test sends the header itself to 127.0.0.1)."""
    settings = write_toml(tmp_path / "master.toml", dict(MASTER_SETTINGS))
    # A link unused for a second gives its tunnel back (swept every half second).
    settings.write_text(settings.read_text() + '[links]\ndomain = "links.test"\nscheme = "http"\nidle_close_s = 1.0\n')
    grid = Grid(tmp_path / "grid")
    try:
        grid.start_master("--config", str(settings))
        grid.start_relay("relay-1", "eu-west")
        sandboxed_hosts(grid, 1)
        alice, bob = renter(grid, "alice"), renter(grid, "bob")
        spec, port = app_workload(drop, "on-domain")
        workload_id = alice.submit_workload(spec)["id"]
        wait_workload(alice, workload_id, "running", lambda w: w["state"] == "running", timeout=30)
        [link] = alice.workload_links(workload_id)["items"]
        host = f"{workload_id}-{port}.links.test"
        assert link["url"] == f"http://{host}/"
        links_port = grid.links_url.rsplit(":", 1)[1]  # the links listener, where the wildcard domain's proxy sends

        async def run() -> tuple[Any, ...]:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
                base = f"http://127.0.0.1:{links_port}"
                owner = {"Host": f"{host}:{links_port}", "Authorization": f"Bearer {alice.api_key}"}
                async with session.get(base + "/api/headers", headers=owner) as seen:
                    headers = await seen.json()
                async with session.ws_connect(base + "/api/kernels/echo", headers=owner) as socket:
                    await socket.send_str("over the domain")
                    echoed = (await socket.receive(timeout=10)).data
                stranger = {"Host": host}
                async with session.get(base + "/", headers=stranger) as refused:
                    refused_status = refused.status
                other = {"Host": host, "Authorization": f"Bearer {bob.api_key}"}
                async with session.get(base + "/", headers=other) as hidden:
                    hidden_status = hidden.status
                # On the links listener a link's host sends every path to the container (/api/v1 is the app's 404).
                async with session.get(base + "/api/v1/workloads", headers=owner) as through:
                    through_status = through.status
                # The API's own listener serves no link, whatever the Host: a misdirected proxy gets 421, not the app.
                misdirected = {"Host": host, "Authorization": f"Bearer {alice.api_key}"}
                async with session.get(grid.api_url + "/api/headers", headers=misdirected) as wrong_port:
                    assert wrong_port.status == 421 and "links listener" in await wrong_port.text()
                return headers, echoed, refused_status, hidden_status, through_status

        headers, echoed, refused_status, hidden_status, through_status = wait_for(
            lambda: (got := asyncio.run(run()))[0].get(":path") == "/api/headers" and got, 30, "the link on its host"
        )
        assert "x-forwarded-prefix" not in headers and headers["x-forwarded-host"] == f"{host}:{links_port}"
        assert echoed == "over the domain"
        assert (refused_status, hidden_status, through_status) == (401, 404, 404)  # the app has no /api/v1 route

        def port_tunnels() -> list[dict[str, Any]]:
            events = grid.client.get("/api/v1/events", subject=workload_id, kind="tunnel.opened", limit=100)["items"]
            return [e for e in events if e["data"]["kind"] == "port"]

        opened = len(port_tunnels())
        assert opened >= 1
        time.sleep(2.5)  # the link idles past idle_close_s: its tunnel is closed, and the next request opens another
        assert asyncio.run(run())[1] == "over the domain"
        assert wait_for(lambda: len(port_tunnels()) == opened + 1, 10, "a new tunnel after the idle one was closed")
    finally:
        grid.stop()


def test_renting_an_offer_with_a_template_prints_its_link_once_it_answers(tmp_path, drop):
    templates = notebook_template(tmp_path / "templates", drop, free_port())
    with running_grid(tmp_path / "grid", MASTER_SETTINGS | {"templates_dir": str(templates)}) as grid:
        [host] = sandboxed_hosts(grid, 1)
        grid.client.set_default_price({"on_demand": "3.60", "min_bid": "1.00"}, provider=TEST_PROVIDER)
        alice = renter(grid, "alice")
        grid.client.credit("alice", "10.00", memo="links test")
        rented = cli(grid, alice.api_key, "rent", host, "--template", "notebook", "--wait-link-s", "90", timeout=150)
        assert rented.returncode == 0, rented.stderr
        assert f"rented {host}: workload wl-" in rented.stdout
        [browser_line] = [line for line in rented.stdout.splitlines() if "open in a browser:" in line]
        status, _, body = asyncio.run(fetch_following(browser_line.split("open in a browser: ", 1)[1]))
        assert status == 200 and b"Notebook server (test app)" in body
        no_image = cli(grid, alice.api_key, "rent", host)
        assert no_image.returncode != 0 and "give --image, a --template" in no_image.stderr
