"""Keeping the fair-share meter (usage.py) in the Master's store, so a restarted Master, or the next one on the same
store, goes on from the usage the last one had instead of from zero.

- **load**, before the loop's first cycle: the saved figures are added to the meter, decayed across the downtime
  (``UsageMeter.restore``). A failed load is logged and tried again before each save; nothing is saved until a load
  has succeeded, so a Master that could not read the figures never overwrites them with its own partial ones.
- **save**, at most every ``every_s`` of the loop's clock: one batch write (``put_many``) in a task of its own, so a
  cycle never waits for the store. A save is not started while the last one is still under way; a failed one is
  logged and tried again after the next cycle. Every store call is bounded by ``timeout_s``.
- **flush**, when the loop stops: a save under way finishes, then a last one is made.

Time the Master was down is decayed but not charged: the meter charges only what it saw running.
"""

from __future__ import annotations

import asyncio
import logging

from management.scheduler.usage import UsageMeter
from management.store.fair_share import FairShareRepo

log = logging.getLogger(__name__)


class UsageSaver:
    def __init__(self, meter: UsageMeter, repo: FairShareRepo, *, every_s: float, timeout_s: float = 10.0) -> None:
        self.meter = meter
        self.repo = repo
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.loaded = False
        self.saves = 0  # successful saves, for tests and metrics
        self._saved_at: float | None = None  # the time the figures last loaded or saved are of
        self._task: asyncio.Task[bool] | None = None

    async def load(self, now: float) -> bool:
        """Add the saved figures to the meter, decayed to ``now``; False (logged) when the store did not answer."""
        try:
            async with asyncio.timeout(self.timeout_s):
                saved = await self.repo.list()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any store failure: the loop schedules on without the history, and tries again
            log.warning("fair-share usage not loaded from the store; tried again before the next save: %s", exc)
            return False
        self.meter.restore(saved, now)
        self.loaded = True
        self._saved_at = now
        log.info("fair-share usage loaded", extra={"figures": len(saved)})
        return True

    def tick(self, now: float) -> None:
        """After a cycle: start a save in the background when one is due and none is under way."""
        if self._task is not None and not self._task.done():
            return
        if self._saved_at is not None and now - self._saved_at < self.every_s:
            return
        self._task = asyncio.create_task(self.save(now), name="fair-share-usage-save")

    async def save(self, now: float) -> bool:
        """Write every figure in one batch (loading first if that has not succeeded yet); False (logged) on failure."""
        if not self.loaded and not await self.load(now):
            return False
        records = self.meter.snapshot_for_store()
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.repo.put_many(records)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any store failure: the figures stay in memory and the next save writes them
            log.warning("fair-share usage not saved to the store; tried again after the next cycle: %s", exc)
            return False
        self._saved_at = now if self.meter.at is None else self.meter.at  # the time the saved figures are of
        self.saves += 1
        return True

    async def flush(self, now: float) -> None:
        """The loop stops: let a save under way finish, then save once more."""
        if self._task is not None:
            await self._task  # bounded: each store call in it is
            self._task = None
        await self.save(now)
