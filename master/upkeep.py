"""The steps of the Master's background loops (``Parts.loops`` in master/composition.py runs them as ``Loop``s).

``sweep``: agents silent too long go offline, commands past their deadline time out, undecodable records are
reported; ``flush``: telemetry rollups and heartbeat-only agent writes, batched; ``keep_history``: finished hours
downsampled, old rollups deleted (master/history.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from common.heap import release_free_memory

if TYPE_CHECKING:
    from master.composition import Parts

log = logging.getLogger(__name__)

SLOW_FLUSH_S = 1.0  # a flush longer than this is logged: writes queued behind it wait as long
# The heartbeat flush comes once a minute after a minute's rollups, and is about an eighth of their records.
HEARTBEAT_SPREAD_SHARE = 0.25


class Upkeep:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self.started_at = 0.0  # when this process began serving (the start grace counts from it)
        self._agents_flushed_at = 0.0  # monotonic time of the last heartbeat flush (master/config.py, heartbeat_flush_s)

    def began(self) -> None:
        """Serving starts now: silence and inherited commands are judged from here (``_in_start_grace``)."""
        self.started_at = time.time()
        self._agents_flushed_at = time.monotonic()

    async def sweep(self) -> None:
        """Agents silent too long go offline; commands past their deadline time out."""
        parts = self._parts
        now = time.time()
        silence = parts.config.heartbeat_s * parts.config.missed_heartbeats
        in_grace = self._in_start_grace(now, silence)
        if not in_grace:
            for agent_id in await parts.registry.sweep(now, silence, parts.hub.heard_within(now, silence)):
                parts.channel.forget(agent_id)
        await parts.commands.expire(now, spare_created_before=self.started_at if in_grace else 0.0)
        await self.report_quarantined()

    async def report_quarantined(self) -> None:
        """One event for each stored record the store found undecodable (and skipped) since the last report."""
        parts = self._parts
        for found in parts.store.quarantine.take_unreported():
            await parts.events.record(
                "store.quarantined", found.key, aggregate=str(found.aggregate), backend=found.backend, reason=found.reason
            )

    def _in_start_grace(self, now: float, silence: float) -> bool:
        """Whether this process is too young to judge anyone's silence.

        After a restart the stored ``last_seen`` dates from before the crash (heartbeats are written
        only with each flush), so sweeping at once would send every agent offline before its relay
        had even reconnected. Silence is counted from the start instead: each agent gets one full
        heartbeat timeout to be heard again. ``last_seen`` itself is left alone, so it stays the
        time the agent was last heard and uptime is not credited for the outage. Commands inherited
        from the previous process wait too before they time out: results a relay buffered while the
        Master was down arrive in that window.
        """
        return now - self.started_at < silence

    async def flush(self) -> None:
        """Telemetry rollups and heartbeat-only agent changes, written in batches."""
        parts = self._parts
        started = time.monotonic()
        spread_s = parts.config.flush_spread_s
        rollups = await parts.telemetry.flush(time.time(), spread_s=spread_s)
        agents = 0
        if started - self._agents_flushed_at >= parts.config.heartbeat_flush_s:
            self._agents_flushed_at = started
            agents = await parts.registry.flush(spread_s=spread_s * HEARTBEAT_SPREAD_SHARE)
        took = time.monotonic() - started
        if took > SLOW_FLUSH_S + spread_s * (1 + HEARTBEAT_SPREAD_SHARE):
            log.warning("slow flush", extra={"rollups": rollups, "agents": agents, "seconds": round(took, 2)})
        if rollups or agents:
            # A minute's rollups leave the C heap full of holes (common/heap.py); on a thread, so that the loop
            # goes on meanwhile.
            await asyncio.to_thread(release_free_memory)

    async def keep_history(self) -> None:
        """Finished hours of telemetry downsampled; rollups past retention deleted (master/history.py)."""
        done = await self._parts.history.step(time.time())
        if done["hours"] or done["deleted"]:
            log.info("telemetry history kept", extra=done)
