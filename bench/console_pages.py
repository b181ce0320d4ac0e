"""``python -m bench console-pages``: the console's fleet pages in Chromium with a large fleet (default 10,000 hosts,
80,000 GPUs).

A generated fleet (bench/api_pages.py) is written to a SQLite store and loaded by the real Master at start, as after a
restart; every GPU of a host that is not offline then reports one sample. The operator signs in through the form in
Debian's Chromium (/usr/bin/chromium, headless, never a downloaded browser) and each page is visited ``rounds`` times:
the time from asking for it to its load event with its table visible. Figures: the best and the slowest visit of each
page. Target: the best visit under 1 s (tests/console/test_large_fleet.py checks what these pages show; how fast they
show it is measured here).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.api_pages import generated_fleet, seed_store
from common.inventory import GpuSample
from master.accounts import BOOTSTRAP_ACCOUNT
from master.config import MasterConfig

T = TypeVar("T")
TARGET_S = 1.0
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPERATOR_PASSWORD = "bench-operator-password"  # a throwaway Master's, set by this bench
PAGES = (  # name, path, the table that shows the page is there
    ("hosts_first_page", "/console/hosts", "table#hosts"),
    ("hosts_filtered", "/console/hosts?state=ready&model=l4&region=us-east", "table#hosts"),
    ("fleet", "/console/fleet", "table#fleet-by-model"),
)


@dataclass(frozen=True)
class ConsolePagesBenchOptions:
    hosts: int = 10_000
    gpus_per_host: int = 8
    rounds: int = 3


class _ThreadedMaster:
    """The real MasterServer on an event loop of its own (a thread), so that synchronous Playwright can drive it."""

    def __init__(self, config: MasterConfig) -> None:
        from management.app import MasterServer  # the real server: middlewares, console, settings

        self.server = MasterServer(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-master", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self) -> None:
        try:
            self.run(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


async def _report_telemetry(server: Any) -> None:
    """One sample from every GPU of the hosts that are not offline, as their agents' telemetry would bring them."""
    telemetry, registry, now = server.master.telemetry, server.master.registry, time.time()
    for agent_id, agent in registry.agents.items():
        if agent.state != "offline":
            samples = [
                GpuSample(uuid=g.uuid, ts=now, utilization_pct=float(g.index * 10), memory_used_mib=1024 * g.index)
                for g in registry.gpus_of(agent_id)
            ]
            telemetry.ingest(agent_id, samples)


def _timed_visit(page: Any, url: str, table: str) -> float:
    started = time.perf_counter()
    response = page.goto(url, wait_until="load")
    page.locator(table).wait_for(state="visible")
    took = time.perf_counter() - started
    if response is None or response.status != 200:
        raise RuntimeError(f"{url} answered {response.status if response else 'nothing'}")
    return took


def run_console_pages_bench(options: ConsolePagesBenchOptions) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # the test extra's driver; Chromium is Debian's

    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/setup-env --test installs Debian's chromium")
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "master"
        fleet = generated_fleet(options.hosts, options.gpus_per_host)
        asyncio.run(seed_store(state_dir, fleet))
        master = _ThreadedMaster(MasterConfig(state_dir=str(state_dir), api_port=0, link_port=0))
        try:
            master.run(master.server.start())
            master.run(master.server.master.accounts.set_password(BOOTSTRAP_ACCOUNT, OPERATOR_PASSWORD))
            master.run(_report_telemetry(master.server))
            base = master.server.api_url
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
                page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
                page.set_default_timeout(30_000)
                page.goto(f"{base}/console/signin")
                page.get_by_label("Account").fill(BOOTSTRAP_ACCOUNT)
                page.get_by_label("Password").fill(OPERATOR_PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(lambda url: "/console/signin" not in url)
                _timed_visit(page, f"{base}/console/hosts", "table#hosts")  # warm: the first request of a session
                pages = []
                for name, path, table in PAGES:
                    times = [_timed_visit(page, f"{base}{path}", table) for _ in range(options.rounds)]
                    best, slowest = min(times), max(times)
                    pages.append(
                        {
                            "name": name,
                            "best_ms": round(best * 1000, 1),
                            "max_ms": round(slowest * 1000, 1),
                            "met": best < TARGET_S,
                        }
                    )
                browser.close()
        finally:
            master.stop()
    return {"hosts": options.hosts, "gpus": len(fleet.gpus), "rounds": options.rounds, "target_s": TARGET_S, "pages": pages}


def console_pages_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['hosts']:,} hosts / {r['gpus']:,} GPUs, {r['rounds']} visits each, Chromium",
        f"{'page':<18} {'best':>9} {'slowest':>9}  target",
    ]
    for p in r["pages"]:
        verdict = "met" if p["met"] else "MISSED"
        lines.append(
            f"{p['name']:<18} {p['best_ms']:>6.0f} ms {p['max_ms']:>6.0f} ms  best < {r['target_s'] * 1000:.0f} ms {verdict}"
        )
    return "\n".join(lines)
