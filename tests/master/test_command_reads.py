"""Reading a command: what the Master has acted on is what a reader sees, even while its record is still on its way to
the store (a poll answered from the store in between would show an older state and wait on the store's queue)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from common.containers import DeleteSpec
from common.wire import CommandResult
from master.config import MasterConfig
from master.master import Master
from master.records import CommandRecord
from tests.master.linked import connect, relay, relay_link


async def test_a_command_the_master_saw_finish_reads_final_while_its_record_is_still_being_written(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    command = await master.create_command("agt-a", DeleteSpec(name="job-1"))
    store = master.store.commands
    put = store.put
    gate, writing = asyncio.Event(), asyncio.Event()

    async def slow_final_put(record: CommandRecord) -> None:
        if record.state == "succeeded":
            writing.set()
            await gate.wait()  # a store queue behind a long batch of telemetry, say
        await put(record)

    monkeypatch.setattr(store, "put", slow_final_put)
    result = asyncio.create_task(relay(master, link, "agt-a", CommandResult(id=command.id, ok=True)))
    await asyncio.wait_for(writing.wait(), 5)
    seen = await master.command(command.id)
    assert seen.state == "succeeded" and seen.finished_at
    stored = await store.get(command.id)
    assert stored is not None and stored.state != "succeeded"  # the store has not got it yet
    gate.set()
    await asyncio.wait_for(result, 5)
    assert (await master.command(command.id)).state == "succeeded"
    assert (await store.get(command.id)).state == "succeeded"  # type: ignore[union-attr]


async def test_a_final_write_that_fails_leaves_the_read_to_the_store(master: Master, monkeypatch: pytest.MonkeyPatch) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    command = await master.create_command("agt-a", DeleteSpec(name="job-1"))
    store = master.store.commands
    put = store.put

    async def failing_final_put(record: CommandRecord) -> None:
        if record.state == "succeeded":
            raise OSError("disk full")
        await put(record)

    monkeypatch.setattr(store, "put", failing_final_put)
    with pytest.raises(OSError, match="disk full"):
        await relay(master, link, "agt-a", CommandResult(id=command.id, ok=True))
    # Not kept aside for ever: the read goes to the store, which holds the last state written.
    stored = await store.get(command.id)
    assert stored is not None and (await master.command(command.id)).state == stored.state


async def test_a_read_waiting_for_a_commands_end_answers_when_the_master_stops(tmp_path: Path) -> None:
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await master.start()
    stopped = False
    try:
        link = relay_link()
        await connect(master, link, "agt-a")
        command = await master.create_command("agt-a", DeleteSpec(name="job-1"))
        waiting = asyncio.create_task(master.command(command.id, wait_s=60))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the command is open: the read waits
        await master.stop()
        stopped = True
        assert (await asyncio.wait_for(waiting, 5)).state == "sent"  # what it had when the Master stopped
    finally:
        if not stopped:
            await master.stop()


async def test_a_stored_command_goes_out_without_waiting_for_its_event_to_be_written(
    master: Master, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from common.wire import Command
    from tests.master.linked import to_agent

    link = relay_link()
    await connect(master, link, "agt-a")
    events = master.store.events
    append_many = events.append_many
    gate = asyncio.Event()

    async def slow_created(records: Any) -> None:
        if any(record.kind == "command.created" for record in records):
            await gate.wait()  # the store's thread busy with a storm's hellos, say
            raise OSError("disk full")
        await append_many(records)

    monkeypatch.setattr(events, "append_many", slow_created)
    creating = asyncio.create_task(master.create_command("agt-a", DeleteSpec(name="job-1")))
    for _ in range(100):
        if any(isinstance(f, Command) for f in to_agent(link, "agt-a")):
            break
        await asyncio.sleep(0.01)
    [sent] = [f for f in to_agent(link, "agt-a") if isinstance(f, Command)]  # out while its event waits
    assert not creating.done()
    gate.set()
    # The event's write failed: the command is stored and on its way all the same, so the caller is told it was
    # accepted (an error would have it retried, and sent twice); the failure is logged.
    record = await asyncio.wait_for(creating, 5)
    assert record.id == sent.body.id and (await master.store.commands.get(record.id)) is not None
    assert f"command {record.id}: its bookkeeping was not written" in caplog.text
