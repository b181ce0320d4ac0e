"""master/batches.py: big writes go in order, in batches, and leave the store idle between batches."""

from __future__ import annotations

import asyncio
import time

import pytest

from master.batches import write_paced


async def test_every_item_is_written_once_in_order_in_batches() -> None:
    batches: list[list[int]] = []

    async def write(batch):
        batches.append(list(batch))

    await write_paced(list(range(1203)), write, batch=500)
    assert [len(b) for b in batches] == [500, 500, 203]
    assert [i for b in batches for i in b] == list(range(1203))


async def test_nothing_to_write_makes_no_call() -> None:
    calls = []

    async def write(batch):
        calls.append(batch)

    await write_paced([], write)
    assert calls == []


async def test_half_duty_rests_after_each_batch_but_the_last_as_long_as_it_took() -> None:
    busy_s = 0.03
    spans: list[tuple[float, float]] = []

    async def write(batch):
        began = time.monotonic()
        await asyncio.sleep(busy_s)
        spans.append((began, time.monotonic()))

    await write_paced(list(range(4)), write, batch=1, duty=0.5)
    gaps = [nxt[0] - prev[1] for prev, nxt in zip(spans, spans[1:])]
    assert len(gaps) == 3
    assert all(gap >= (prev[1] - prev[0]) * 0.99 for gap, prev in zip(gaps, spans))  # rested as long as it worked


async def test_the_event_loop_serves_others_while_a_paced_write_rests() -> None:
    ticks = 0

    async def other_work():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def write(batch):
        time.sleep(0.01)  # a store call that keeps its caller busy

    other = asyncio.create_task(other_work())
    await write_paced(list(range(5)), write, batch=1)
    other.cancel()
    assert ticks >= 4  # ran in every rest between batches


def test_a_duty_outside_zero_to_one_is_refused() -> None:
    async def write(batch):
        pass

    with pytest.raises(ValueError, match="duty"):
        asyncio.run(write_paced([1], write, duty=0))
