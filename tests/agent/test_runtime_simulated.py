"""The simulated runtime's renter access: fixed logs, an echoing exec and no ports, so the fleet simulator and the
tunnel's tests get the same answers every time without running anything."""

import asyncio

import pytest

from agent.runtime.base import STDOUT
from agent.runtime.simulated import SimulatedRuntime
from common.containers import LABEL_COMMAND_ID, ContainerSpec
from common.errors import RuntimeFailure


@pytest.fixture
async def runtime():
    rt = SimulatedRuntime(log_interval_s=0.01)
    await rt.create(ContainerSpec(name="sim-1", image="none", command=["train"]), labels={LABEL_COMMAND_ID: "cmd-1"})
    return rt


async def lines(runtime, name, tail):
    return [chunk async for chunk in runtime.logs(name, tail=tail, follow=False)]


async def test_logs_are_a_few_lines_naming_the_container_and_tail_counts_lines(runtime):
    everything = await lines(runtime, "sim-1", -1)
    assert len(everything) == 3
    assert all(channel == STDOUT and data.startswith(b"[sim-1] ") and data.endswith(b"\n") for channel, data in everything)
    assert await lines(runtime, "sim-1", -1) == everything  # deterministic
    assert await lines(runtime, "sim-1", 2) == everything[1:]
    assert await lines(runtime, "sim-1", 0) == []
    assert await lines(runtime, "sim-1", 50) == everything


async def test_following_logs_adds_a_line_each_interval_until_the_container_is_deleted(runtime):
    stream = runtime.logs("sim-1", tail=0, follow=True)
    assert await asyncio.wait_for(anext(stream), 5) == (STDOUT, b"[sim-1] simulated output line 1\n")
    assert await asyncio.wait_for(anext(stream), 5) == (STDOUT, b"[sim-1] simulated output line 2\n")
    await runtime.delete("sim-1")
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)


@pytest.mark.parametrize("end", ["delete", "finish"])
async def test_a_followed_log_ends_when_its_container_ends_not_at_its_next_line(end):
    """As an engine closes the stream at the container's exit: the output keeper follows a container through its
    delete, and a follower sleeping to its next line (an hour away here) made every simulated delete wait for it."""
    rt = SimulatedRuntime(log_interval_s=3600)
    await rt.create(ContainerSpec(name="sim-1", image="none", command=["train"]), labels={LABEL_COMMAND_ID: "cmd-1"})
    stream = rt.logs("sim-1", tail=0, follow=True)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # the follower is asleep, waiting for its first line
    assert not waiting.done()
    if end == "delete":
        await rt.delete("sim-1")
    else:
        rt.finish("sim-1", 0)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 5)
    assert rt._ended == {}  # nothing kept for an ended container


async def test_exec_echoes_what_it_is_written_and_exits_0_at_end_of_input(runtime):
    session = await runtime.exec("sim-1", ["sh"], tty=True, cols=100, rows=30)
    await session.write(b"ls\r")
    assert await session.read() == (STDOUT, b"ls\r")
    await session.resize(132, 50)
    assert session.size == (132, 50)
    await session.write(b"exit\r")
    await session.close_stdin()
    assert await session.read() == (STDOUT, b"exit\r")
    assert await session.read() is None
    assert await asyncio.wait_for(session.wait(), 5) == 0
    with pytest.raises(BrokenPipeError, match="input is closed"):  # as a pipe to an ended process would
        await session.write(b"more")


async def test_closing_a_simulated_exec_ends_it_as_killed(runtime):
    session = await runtime.exec("sim-1", ["sleep", "100"], tty=False)
    await session.close()
    assert await session.read() is None
    assert await asyncio.wait_for(session.wait(), 5) == 137


async def test_a_simulated_container_has_no_ports_and_absent_or_finished_ones_refuse_access(runtime):
    with pytest.raises(RuntimeFailure, match="a simulated container has no ports"):
        await runtime.connect("sim-1", 8888)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await lines(runtime, "ghost", 10)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await runtime.exec("ghost", ["sh"], tty=False)
    runtime.finish("sim-1", 0)
    with pytest.raises(RuntimeFailure, match=r"container 'sim-1' is not running \(it is exited\)"):
        await runtime.exec("sim-1", ["sh"], tty=False)


def test_a_log_interval_must_be_positive():
    with pytest.raises(ValueError, match="log_interval_s must be positive"):
        SimulatedRuntime(log_interval_s=0)
