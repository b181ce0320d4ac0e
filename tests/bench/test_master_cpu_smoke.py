"""``python -m bench.master_cpu`` works: a few agents say hello through a link's intake and their telemetry is taken,
its figures are given (a harness check, not a speed)."""

from __future__ import annotations

import argparse

from bench.master_cpu import measure


async def test_the_master_cpu_bench_welcomes_every_agent_and_takes_every_gpus_telemetry():
    args = argparse.Namespace(agents=12, folds=2, batch=5, socket=False, batches=True, profile="", profile_phase="ramp")
    result = await measure(args)
    assert result["gpus"] == 12 * 8 and result["latest"] == 12 * 8
    assert result["samples"] == 12 * 8 * 2
    assert 1 <= result["messages_to_relay_in_ramp"] < 12  # the welcomes joined, as to a relay that takes batches
    assert result["hello_loop_us"] > 0 and result["sample_loop_us"] > 0
