"""State that cannot be trusted is refused on the way in, and what the store cannot hand back does not stop the Master."""

from __future__ import annotations

import math
import sqlite3

import pytest

from common.containers import DeleteSpec
from master.commands import InvalidCommand
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import connect, enrolled, events, relay_link


@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -math.inf, 0.0, -5.0])
async def test_the_ledger_refuses_a_timeout_that_is_not_a_positive_number(master, timeout_s):
    await enrolled(master, "agt-a")
    with pytest.raises(InvalidCommand, match="timeout_s must be a positive number of seconds"):
        await master.create_command("agt-a", DeleteSpec(name="j"), timeout_s=timeout_s)
    assert await master.list_commands() == []


async def test_a_record_the_store_cannot_decode_leaves_everything_else_served(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    first = Master(config)
    await first.start()
    try:
        await connect(first, relay_link(), "agt-a")
        good = await first.create_command("agt-a", DeleteSpec(name="j"))
        bad = await first.create_command("agt-a", DeleteSpec(name="k"))
    finally:
        await first.stop()
    with sqlite3.connect(tmp_path / "master.db") as db:  # what NaN became in JSON: null, which no float decodes from
        db.execute('UPDATE commands SET doc = replace(doc, \'"deadline":\', \'"deadline":null,"x":\') WHERE id = ?', [bad.id])

    again = Master(config)
    await again.start()
    try:
        assert again.agent("agt-a").id == "agt-a" and len(again.gpus("agt-a")) == 2
        assert bad.id not in again.commands.open
        if good.id not in again.commands.open:  # this store fails the whole list: the Master says so and goes on
            [problem] = await events(again, "master.load_failed")
            assert problem.subject == "commands"
        await again.create_command("agt-a", DeleteSpec(name="m"))
    finally:
        await again.stop()
