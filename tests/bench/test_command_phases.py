"""The fleet bench's cut of a command's round trip into phases, where the Master's record and the agent stamp it."""

from __future__ import annotations

import pytest

from bench.fleet import PHASES, CommandTiming, command_phases, phase_summary

ISSUED = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def record(created: str, sent: str | None, acked: str | None, finished: str | None) -> dict[str, str | None]:
    return {"created_at": created, "sent_at": sent, "acked_at": acked, "finished_at": finished}


FULL = record("2027-01-15T08:00:00.010Z", "2027-01-15T08:00:00.030Z", "2027-01-15T08:00:01.030Z", "2027-01-15T08:00:01.040Z")


def test_the_stamps_of_the_record_and_the_agent_cut_the_round_trip_into_phases_that_add_up_to_it():
    agent = [ISSUED + 0.035, ISSUED + 0.036, ISSUED + 1.038]  # came in, ack out, result out
    phases = command_phases(ISSUED, ISSUED + 1.5, FULL, agent)
    assert list(phases) == list(PHASES)
    assert phases == {
        "issue": 10.0,
        "send": 20.0,
        "to_agent": 5.0,
        "agent_ack": 1.0,
        "ack_back": 994.0,  # the ack waited on its way back: relay or the Master's intake
        "agent_run": 1002.0,
        "result_back": 2.0,
        "seen": 460.0,
    }
    # from the agent's ack to the Master's result the cut goes ack -> result out -> finished: the ack's way back
    # and the agent's run overlap, so only the phases on one path add up to the whole
    path = ("issue", "send", "to_agent", "agent_ack", "agent_run", "result_back", "seen")
    assert sum(phases[p] or 0 for p in path) == pytest.approx(1500.0)


def test_a_phase_whose_stamp_is_missing_reads_none_not_zero():
    failed = record("2027-01-15T08:00:00.010Z", None, None, "2027-01-15T08:00:00.050Z")
    phases = command_phases(ISSUED, ISSUED + 0.1, failed, None)
    assert phases["issue"] == 10.0 and phases["seen"] == 50.0
    assert all(phases[p] is None for p in ("send", "to_agent", "agent_ack", "ack_back", "agent_run", "result_back"))


def test_a_timing_is_cut_with_the_marks_of_its_own_command_only():
    timing = CommandTiming("create_container", "succeeded", 1.5, 0.0, {}, "c-1", (ISSUED, ISSUED + 1.5, FULL))
    timing.cut({"c-2": [ISSUED + 0.035, ISSUED + 0.036, ISSUED + 1.038]})
    assert timing.phases["to_agent"] is None and timing.phases["send"] == 20.0
    timing.cut({"c-1": [ISSUED + 0.035, ISSUED + 0.036, ISSUED + 1.038]})
    assert timing.phases["to_agent"] == 5.0


def test_the_summary_names_the_phase_the_slowest_commands_waited_in():
    quick: dict[str, float | None] = dict.fromkeys(PHASES, 5.0)
    timings = [CommandTiming("create_container", "succeeded", 0.04, 0.0, quick) for _ in range(198)]
    timings += [
        CommandTiming("create_container", "succeeded", 1.2, 0.0, {**quick, "to_agent": 1160.0}),
        CommandTiming("delete_container", "succeeded", 0.9, 0.0, {**quick, "seen": 870.0}),
        CommandTiming("create_container", "no_final_state", 30.0, 0.0, {}),  # never final: out of every figure
    ]
    summary = phase_summary(timings)
    assert summary["tail_held_in"] == {"to_agent": 1, "seen": 1}  # the slowest 1 % of 200 is two commands
    assert summary["to_agent"] == {"p50_ms": 5.0, "p99_ms": 5.0}
    assert phase_summary([])["tail_held_in"] == {}
