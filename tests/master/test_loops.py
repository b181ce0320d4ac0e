"""Background loops: named, periodic, and a step that raises does not end the loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from master.loops import Loop


async def test_a_loop_whose_step_raises_is_logged_and_runs_again(caplog: pytest.LogCaptureFixture):
    calls = 0
    again = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("store went away")
        again.set()

    caplog.set_level(logging.ERROR, logger="master.loops")
    task = Loop("sweep", 0.01, step, restart_s=0.01).start()
    try:
        await asyncio.wait_for(again.wait(), timeout=5)
    finally:
        task.cancel()
    assert task.get_name() == "sweep"
    assert "loop sweep failed" in caplog.text and "store went away" in caplog.text
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_loop_with_a_first_wait_runs_its_first_step_after_it_then_every_period(monkeypatch: pytest.MonkeyPatch):
    waits: list[float] = []
    steps = 0
    real_sleep = asyncio.sleep

    async def recorded_sleep(seconds: float) -> None:  # the loop's own rests, recorded instead of slept
        waits.append(seconds)
        await real_sleep(0)

    async def step() -> None:
        nonlocal steps
        steps += 1

    monkeypatch.setattr("master.loops.asyncio.sleep", recorded_sleep)
    task = Loop("reconcile", 86400.0, step, restart_s=1.0, first_s=60.0).start()
    for _ in range(1000):  # bounded
        if steps >= 3:
            break
        await real_sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waits[:3] == [60.0, 86400.0, 86400.0]
