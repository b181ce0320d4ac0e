"""master/batches.py: big writes go in order, in batches, and leave the store idle between batches."""

from __future__ import annotations

import asyncio
import time

import pytest

from master.batches import GroupWrite, write_paced


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


class FakeClock:
    """``time.monotonic`` and ``asyncio.sleep`` of master/batches.py on a clock that moves only when told: a write
    takes ``busy_s`` of it, a rest as long as asked. The pacing's arithmetic is checked exactly, on any machine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, busy_s: float) -> None:
        self.now, self.busy_s = 0.0, busy_s
        self.starts: list[float] = []
        self.rests: list[float] = []
        monkeypatch.setattr("master.batches.time.monotonic", lambda: self.now)
        monkeypatch.setattr("master.batches.asyncio.sleep", self.sleep)

    async def sleep(self, seconds: float) -> None:
        self.rests.append(seconds)
        self.now += seconds

    async def write(self, batch) -> None:
        self.starts.append(self.now)
        self.now += self.busy_s


async def test_a_spread_write_starts_its_batches_at_even_steps_and_ends_with_its_window(monkeypatch) -> None:
    clock = FakeClock(monkeypatch, busy_s=0.01)
    await write_paced(list(range(5)), clock.write, batch=1, duty=0.5, spread_s=1.0)
    steps = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    assert steps == pytest.approx([steps[0]] * 4) and steps[0] == pytest.approx((1.0 - 0.01) / 4)
    assert clock.now == pytest.approx(1.0)  # the last batch ends as the window does: nothing left for the next flush


async def test_the_duty_still_bounds_a_spread_write_whose_batches_are_slow(monkeypatch) -> None:
    clock = FakeClock(monkeypatch, busy_s=0.3)  # three batches of 0.3 s cannot fit half-busy in 0.5 s
    await write_paced(list(range(3)), clock.write, batch=1, duty=0.5, spread_s=0.5)
    assert clock.rests == pytest.approx([0.3, 0.3])  # as long as each took: the store is never more than half busy
    assert clock.now == pytest.approx(1.5)


async def test_without_a_spread_only_the_duty_rests(monkeypatch) -> None:
    clock = FakeClock(monkeypatch, busy_s=0.02)
    await write_paced(list(range(3)), clock.write, batch=1, duty=0.5)
    assert clock.rests == pytest.approx([0.02, 0.02])


def test_a_negative_spread_is_refused() -> None:
    async def write(batch):
        pass

    with pytest.raises(ValueError, match="spread_s"):
        asyncio.run(write_paced([1], write, spread_s=-1.0))


async def test_callers_at_once_share_a_write_in_the_order_they_put_and_each_returns_once_its_items_are_written() -> None:
    writes: list[list[int]] = []
    release = asyncio.Event()

    async def write(items):
        writes.append(list(items))
        await release.wait()  # a store round trip: callers arriving meanwhile wait for the next write

    group: GroupWrite[int] = GroupWrite(write, batch=100)
    first = asyncio.create_task(group.put([0]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first write is under way
    others = [asyncio.create_task(group.put([n, n + 1])) for n in range(1, 40, 2)]
    await asyncio.sleep(0)
    assert writes == [[0]] and not first.done()
    release.set()
    await asyncio.gather(first, *others)
    assert writes == [[0], list(range(1, 41))]  # twenty callers, one write, in order
    assert group.writes == 2


async def test_a_group_never_splits_a_callers_items_and_keeps_under_its_batch() -> None:
    writes: list[list[int]] = []

    async def write(items):
        writes.append(list(items))
        await asyncio.sleep(0)

    group: GroupWrite[int] = GroupWrite(write, batch=5)
    await asyncio.gather(*(group.put([n] * 3) for n in range(4)), group.put(list(range(10, 18))))
    assert [i for w in writes for i in w] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 + list(range(10, 18))
    assert all(len(w) <= 5 or len(set(w)) == len(w) for w in writes)  # only a caller's own items exceed the batch
    assert [len(w) for w in writes] == [3, 3, 3, 3, 8]


async def test_a_failing_group_is_written_caller_by_caller_so_only_the_bad_record_fails_its_caller() -> None:
    stored: list[int] = []
    release = asyncio.Event()

    async def write(items):
        await release.wait()
        if -1 in items:
            raise ValueError("unstorable record")
        stored.extend(items)

    group: GroupWrite[int] = GroupWrite(write)
    first = asyncio.create_task(group.put([0]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    good, bad, later = (asyncio.create_task(group.put(items)) for items in ([1], [-1], [2]))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, good, later)
    with pytest.raises(ValueError, match="unstorable"):
        await bad
    assert stored == [0, 1, 2]
