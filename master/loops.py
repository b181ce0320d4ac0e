"""The Master's background work as small, named, restartable loops.

Each loop runs one step every period. A step that raises is logged with the loop's name and the loop
goes on after a pause: one bad sweep must not stop every later sweep. Cancelling the task stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.errors import Fenced

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Loop:
    name: str
    period_s: float
    step: Step
    restart_s: float  # the pause after a step that raised
    first_s: float | None = None  # the wait before the first step (None: a period)

    async def run(self) -> None:
        wait = self.period_s if self.first_s is None else self.first_s
        while True:
            await asyncio.sleep(wait)
            wait = self.period_s
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Fenced as exc:  # this Master no longer leads (docs/ha.md): it is stepping down, nothing to debug
                log.warning("loop %s: %s", self.name, exc)
                await asyncio.sleep(self.restart_s)
            except Exception:
                log.exception("loop %s failed; running it again in %.1f s", self.name, self.restart_s)
                await asyncio.sleep(self.restart_s)

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name=self.name)


async def stop_loop(task: asyncio.Task[None] | None) -> None:
    """Cancel a loop's task (None: never started) and wait until it has stopped."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
