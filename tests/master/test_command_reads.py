"""Reading a command: what the Master has acted on is what a reader sees, even while its record is still on its way to
the store (a poll answered from the store in between would show an older state and wait on the store's queue)."""

from __future__ import annotations

import asyncio

import pytest

from common.wire import CommandResult
from master.master import Master
from master.records import CommandRecord
from tests.master.linked import connect, relay, relay_link


async def test_a_command_the_master_saw_finish_reads_final_while_its_record_is_still_being_written(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    command = await master.create_command("agt-a", "delete_container", {"name": "job-1"})
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
    command = await master.create_command("agt-a", "delete_container", {"name": "job-1"})
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
    assert (await master.command(command.id)).state == (await store.get(command.id)).state
