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
