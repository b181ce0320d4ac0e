"""The console's test harness: a real Master serving the console in-process, Debian's Chromium driven by Playwright,
and screenshots of each step.

- ``console_master``: a MasterServer (SQLite in the test's tmp_path, the API and the console on a free port) running
  on an event loop of its own in a thread, with three accounts that have console passwords (``ACCOUNTS``);
  ``console_master.run(coro)`` runs a coroutine on the Master's loop (to seed data through the façade).
- ``browser`` (one Chromium per module: /usr/bin/chromium, headless, never a downloaded browser) and ``page`` (a
  fresh context per test: no cookies carried from another test).
- ``shot(page, "step")`` saves ``$IDLEGRID_SCREENSHOTS/<test>/NN-step.png`` (default .artifacts/screenshots/).
- ``sign_in(page, role)`` signs in through the form as the operator, the provider or the renter.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from management.app import MasterServer
from master.accounts import BOOTSTRAP_ACCOUNT
from master.config import ConsoleSettings, MasterConfig
from master.records import AccountRecord
from tests.console.plain_http import Console, console_for

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
T = TypeVar("T")


@dataclass(frozen=True)
class ConsoleAccount:
    id: str
    role: str
    password: str
    name: str


ACCOUNTS = {
    "operator": ConsoleAccount(BOOTSTRAP_ACCOUNT, "operator", "operator-password-1", ""),
    "provider": ConsoleAccount("acme", "provider", "provider-password-1", "Acme GPUs"),
    "renter": ConsoleAccount("rita", "renter", "renter-password-1", "Rita Renter"),
}


class ConsoleMaster:
    """A MasterServer on a loop of its own (a thread), so that synchronous Playwright can drive its console."""

    def __init__(self, config: MasterConfig) -> None:
        self.server = MasterServer(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="console-master", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def url(self) -> str:
        return self.server.api_url

    @property
    def services(self):
        return self.server.services

    def start(self) -> None:
        self.run(self.server.start())
        self.run(self._accounts())

    async def _accounts(self) -> None:
        accounts = self.server.master.accounts
        for account in ACCOUNTS.values():
            if account.id != BOOTSTRAP_ACCOUNT:
                await accounts.create(AccountRecord(id=account.id, role=account.role, name=account.name))
            await accounts.set_password(account.id, account.password)

    def stop(self) -> None:
        try:
            self.run(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


def console_config(tmp_path: Path, **console: Any) -> MasterConfig:
    settings = {"signin_burst": 50, "signin_per_minute": 600.0, **console}
    return MasterConfig(
        state_dir=str(tmp_path / "master"),
        api_port=0,
        link_port=0,
        console=ConsoleSettings(**settings),
        # The storage pages' stand-in endpoint, http://127.0.0.1:9000 (nothing connects to it here): a private target
        # a renter may name only because the operator allows it by name (common/egress.py).
        egress_allow=["127.0.0.1:9000"],
        # The console tests' hosts are records with no agent behind them: at the default (5 s, offline after 3 missed)
        # a loaded machine walking a page for longer than 15 s saw its host go offline mid-test.
        heartbeat_s=3600.0,
    )


@pytest.fixture
def console_master(tmp_path: Path) -> Iterator[ConsoleMaster]:
    master = ConsoleMaster(console_config(tmp_path))
    master.start()
    yield master
    master.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module: Playwright's synchronous API keeps an event loop marked running in this thread
    while it is started, which pytest-asyncio's tests (in other modules) cannot run beside."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/setup-env --test installs it as root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    # Bounds that catch a hang, not speed (bench console-pages times the pages): a loaded CI machine took more than
    # 10 s for a page's load now and then (test_launch_forms' goto, 2026-12-07).
    context.set_default_timeout(20_000)
    context.set_default_navigation_timeout(30_000)
    page = context.new_page()
    yield page
    context.close()


def screenshots_dir() -> Path:
    configured = os.environ.get("IDLEGRID_SCREENSHOTS")
    return Path(configured) if configured else REPO / ".artifacts" / "screenshots"


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """``shot(page, "step")``: a full-page screenshot, numbered in the order taken, under the test's own folder."""
    folder = screenshots_dir() / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    if folder.exists():
        for old in folder.glob("*.png"):
            old.unlink()
    taken = [0]

    def take(page: Any, step: str) -> Path:
        taken[0] += 1
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{taken[0]:02d}-{re.sub(r'[^A-Za-z0-9_-]+', '-', step)}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def sign_in_as(page: Any, base_url: str, role: str) -> ConsoleAccount:
    """Sign in through the form; returns the account. Fails the test if the console does not leave the sign-in page."""
    account = ACCOUNTS[role]
    page.goto(f"{base_url}/console/signin")
    page.get_by_label("Account").fill(account.id)
    page.get_by_label("Password").fill(account.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/console/signin" not in url)
    return account


@pytest.fixture
def sign_in(console_master: ConsoleMaster) -> Callable[[Any, str], ConsoleAccount]:
    return lambda page, role: sign_in_as(page, console_master.url, role)


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[Console]:
    """The console over plain HTTP (tests/console/plain_http.py) on a Master with the renter rita."""
    client = await console_for(tmp_path)
    yield client
    await client.close()
    await client.master.stop()
