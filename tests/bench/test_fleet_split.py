"""A fleet split over processes: process p runs agents p, p + procs, ... (bench/fleet.py), so with one process per
relay each process holds exactly one relay's agents (agent i dials relay i % relays first); from 5,000 agents on, that
is the default."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bench.fleet import SPLIT_FROM_AGENTS, FleetOptions
from bench.fleet_agents import FleetSettings, _indexes, agent_dir


def test_a_process_runs_every_stride_th_agent_from_its_first(tmp_path: Path) -> None:
    for index in range(7):
        agent_dir(tmp_path, index).mkdir(parents=True)
        (agent_dir(tmp_path, index) / "identity.json").write_text("{}")
    assert _indexes(tmp_path, 0, 4, stride=2) == [0, 2, 4, 6]
    assert _indexes(tmp_path, 1, 3, stride=2) == [1, 3, 5]
    assert _indexes(tmp_path, 2, 0) == [2, 3, 4, 5, 6]  # no count: every agent from the first on
    with pytest.raises(FileNotFoundError):
        _indexes(tmp_path, 1, 4, stride=2)  # agent 7 was never provisioned


def test_a_stride_needs_a_count() -> None:
    with pytest.raises(msgspec.ValidationError, match="stride"):
        msgspec.convert({"agents_dir": "x", "access_urls": ["wss://127.0.0.1:1"], "stride": 2}, FleetSettings)


def test_a_large_fleet_runs_in_one_process_per_relay_unless_told_otherwise() -> None:
    assert FleetOptions(agents=SPLIT_FROM_AGENTS - 1).processes == 1
    assert FleetOptions(agents=10_000, relays=2).processes == 2  # each process then holds one relay's agents
    assert FleetOptions(agents=10_000, relays=3).processes == 3
    assert FleetOptions(agents=10_000, fleet_procs=1).processes == 1  # asked for: one process, as before
    assert FleetOptions(agents=200, fleet_procs=4).processes == 4
