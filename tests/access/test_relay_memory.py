"""The relay keeps nothing per frame: after thousands of frames its heap is back where it was.

A relay carries thousands of agents for weeks; any state it kept per relayed frame would grow without
bound (and make every garbage collection longer, bench/HISTORY.md). This counts the objects the
collector tracks in this process (the relay runs in it, with a Master stand-in whose record of frames
is emptied before each count) after a warm-up round and after a round ten times larger.
"""

from __future__ import annotations

import asyncio
import gc

from common.wire import Relay
from tests.access.conftest import result

AGENTS = 10
WARM_UP_PER_AGENT = 100
ROUND_PER_AGENT = 1000
# Objects the heap may gain between the two counts for reasons other than frames (asyncio's and the
# TLS layer's own bookkeeping settles at any size); per-frame retention would add one or more per frame,
# that is 10,000 or more here.
SLACK_OBJECTS = 1500


def _relayed(master) -> int:
    # Only the agents' command results: the relay also sends the Master frames of its own (its load, on a
    # timer), and on a slow machine one of those can fall inside a round.
    return sum(1 for frame in master.frames if isinstance(frame, Relay) and b'"command_result"' in bytes(frame.frame))


async def _send_round(agents, master, per_agent: int, first_seq: int) -> None:
    expected = _relayed(master) + per_agent * len(agents)
    # Command results: control frames, each relayed (heartbeats and telemetry are coalesced while the link is busy,
    # docs/overload.md, so a burst of them would not all reach the Master).
    for n in range(per_agent):
        for index, ws in enumerate(agents):
            await ws.send(result(f"cmd-{index}-{first_seq + n}"))
        if n % 20 == 19:
            await asyncio.sleep(0)  # let the relay read between bursts
    await master.wait_for(lambda: _relayed(master) >= expected, f"{expected} frames at the Master", timeout=60)


def _tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_the_relay_keeps_no_state_per_relayed_frame(make_relay, master, pki, open_agent):
    relay = await make_relay(rate_per_agent=100_000.0, burst=100_000, flood_limit=1_000_000)
    creds = [pki.agent() for _ in range(AGENTS)]
    async with asyncio.TaskGroup() as tg:
        opens = [tg.create_task(open_agent(relay, who).__aenter__()) for who in creds]
    agents = [task.result() for task in opens]
    try:
        await _send_round(agents, master, WARM_UP_PER_AGENT, 0)
        master.frames.clear()
        before = _tracked_objects()
        await _send_round(agents, master, ROUND_PER_AGENT, WARM_UP_PER_AGENT)
        relayed = _relayed(master)
        master.frames.clear()
        after = _tracked_objects()
    finally:
        for ws in agents:
            await ws.close()
    assert relayed == AGENTS * ROUND_PER_AGENT
    print(f"tracked objects before {before}, after {after}: {after - before:+d} over {relayed} relayed frames")
    assert after - before < SLACK_OBJECTS, f"the relay's heap grew by {after - before} objects over {relayed} frames"
