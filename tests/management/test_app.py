"""The composition root (management/app.py): each part built once over one Master, the state read from the store once
before the first call and never again by a call, the loops started in one order and stopped in the reverse one.

A real Master on a real SQLite store behind the real HTTP API; the parts are the real ones, with their ``load``,
``start`` and ``stop`` wrapped to record the calls (the wrappers call through)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from management.app import Composition, MasterServer, compose
from management.services import Services
from master.config import MasterConfig
from master.records import AccountRecord

ROOT = Path(__file__).resolve().parents[2]


def record(calls: list[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return method(*args, **kwargs)

    return wrapper


def loaded(part: Any) -> bool:
    """Whether a state part has read the store (each keeps a flag; a second ``load`` returns at once)."""
    return bool(getattr(part, "loaded", False) or getattr(part, "_loaded", False))


def record_load(calls: list[str], name: str, part: Any) -> Callable[..., Any]:
    method = part.load

    async def wrapper() -> Any:
        calls.append(f"load {name}" if not loaded(part) else f"loaded {name}")  # "loaded": asked again, read nothing
        return await method()

    return wrapper


def spy(composition: Composition, calls: list[str]) -> None:
    """Record every load, start and stop of ``composition``'s parts in ``calls`` ("load prices", "start market"...)."""
    for name, part in composition.state:
        part.load = record_load(calls, name, part)  # type: ignore[method-assign]
    for name, loop in composition.loops:
        loop.start = record(calls, f"start {name}", loop.start)  # type: ignore[method-assign]
        loop.stop = record(calls, f"stop {name}", loop.stop)  # type: ignore[method-assign]


@pytest.fixture
async def server(tmp_path):
    server = MasterServer(MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0))
    calls: list[str] = []
    spy(server.composition, calls)
    server.calls = calls  # type: ignore[attr-defined]
    await server.start()
    yield server
    await server.stop()


async def test_the_state_is_read_once_in_order_before_the_loops_start(server):
    reads = [c for c in server.calls if c.startswith("load ")]
    assert reads == [
        "load prices",
        "load workloads",
        "load market",
        "load alert settings",
        "load endpoints",
        "load endpoint requests",
    ]
    assert all(loaded(part) for _, part in server.composition.state)
    # The market asks for the price and workload books it reads: they were loaded already and read nothing again.
    assert set(server.calls) - set(reads) - {c for c in server.calls if c.startswith("start ")} <= {
        "loaded prices",
        "loaded workloads",
    }
    starts = [c for c in server.calls if c.startswith("start ")]
    assert starts == [
        "start market",
        "start outputs",
        "start scheduler",
        "start links",
        "start alerts",
        "start request webhooks",
        "start endpoint requests",
        "start endpoint readiness",
        "start endpoint scaler",
        "start payments",
        "start auto top-up",
        "start spend caps",
        "start payouts",
    ]
    assert server.calls.index(starts[0]) > server.calls.index("load endpoint requests")


async def test_no_call_loads_state_after_the_root_has_loaded_it(server):
    token = server.operator_token_file.read_text().strip()
    await server.master.accounts.create(AccountRecord(id="rita", role="renter"))
    before = list(server.calls)
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(server.api_url, headers=auth) as http:
        for path in ("/api/v1/prices", "/api/v1/offers", "/api/v1/workloads", "/api/v1/rentals", "/api/v1/accounts/rita/balance"):
            async with http.get(path) as answer:
                assert answer.status == 200, (path, await answer.text())
        spec = {"name": "x", "image": "python:3.12", "account": "rita"}
        async with http.post("/api/v1/workloads", json=spec) as answer:
            assert answer.status in (201, 402), await answer.text()  # admitted or refused on money: either way it read
    assert [c for c in server.calls[len(before) :] if c.startswith("load")] == [], "a call loaded state"


async def test_the_loops_stop_in_the_reverse_order_of_their_start(tmp_path):
    server = MasterServer(MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0))
    calls: list[str] = []
    spy(server.composition, calls)
    await server.start()
    await server.stop()
    started = [c.removeprefix("start ") for c in calls if c.startswith("start ")]
    stopped = [c.removeprefix("stop ") for c in calls if c.startswith("stop ")]
    assert started == [
        "market",
        "outputs",
        "scheduler",
        "links",
        "alerts",
        "request webhooks",
        "endpoint requests",
        "endpoint readiness",
        "endpoint scaler",
        "payments",
        "auto top-up",
        "spend caps",
        "payouts",
    ]
    assert stopped == list(reversed(started))


async def test_composing_reads_and_starts_nothing_until_the_root_loads(tmp_path):
    """A composition is inert until the root loads and starts it: what lets a standby Master (docs/ha.md) compose at
    start and load only once elected (tests/management/test_ha_server.py runs that path)."""
    from master.master import Master

    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        calls: list[str] = []
        composition = compose(master)
        spy(composition, calls)
        assert calls == []
        assert isinstance(composition.services, Services)
        await composition.load()
        assert [c for c in calls if c.startswith("load ")] == [f"load {name}" for name, _ in composition.state]
        assert not [c for c in calls if c.startswith("start ")]  # loading starts no loop: the root does, separately
    finally:
        await master.stop()


def test_services_are_one_frozen_object_built_only_by_the_composition_root():
    assert Services.__dataclass_params__.frozen  # type: ignore[attr-defined]
    builders = []
    for path in (ROOT / "management").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Services":
                builders.append(path.relative_to(ROOT).as_posix())
    assert builders == ["management/app.py"]


def test_handlers_and_pages_reach_no_further_than_a_service_and_load_nothing():
    """They call ``services.<resource>.<method>``: never the market's insides (``.market.market``) nor a ``load``."""
    offenders = []
    for folder in ("api", "console", "onboarding"):
        for path in (ROOT / "management" / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if ".market.market" in line or ".load()" in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
