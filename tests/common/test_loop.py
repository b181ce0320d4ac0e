"""The daemons' event loop: uvloop unless IDLEGRID_EVENT_LOOP asks for asyncio's; a typo is an error, not a guess."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from common.errors import ConfigError
from common.loop import ENV, run, running_uvloop


async def _which() -> bool:
    await asyncio.sleep(0)
    return running_uvloop()


def test_uvloop_is_the_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert run(_which()) is True


def test_asyncio_s_own_loop_on_request(monkeypatch):
    monkeypatch.setenv(ENV, "asyncio")
    assert run(_which()) is False


def test_an_unknown_loop_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(ENV, "trio")
    coro = _which()
    with pytest.raises(ConfigError, match="uvloop, asyncio"):
        run(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # closed, not left to warn that it was never awaited
