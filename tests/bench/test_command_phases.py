"""The fleet bench's cut of a command's round trip into the phases its record is stamped at (pure functions)."""

from __future__ import annotations

import pytest

from bench.fleet import CommandTiming, command_phases, phase_summary


def record(created: str, sent: str | None, acked: str | None, finished: str | None) -> dict[str, str | None]:
    return {"created_at": created, "sent_at": sent, "acked_at": acked, "finished_at": finished}


def test_a_record_s_stamps_cut_the_round_trip_into_phases_that_add_up_to_it():
    issued = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    phases = command_phases(
        issued,
        issued + 1.5,
        record("2027-01-15T08:00:00.010Z", "2027-01-15T08:00:00.030Z", "2027-01-15T08:00:01.030Z", "2027-01-15T08:00:01.040Z"),
    )
    assert phases == {"issue": 10.0, "send": 20.0, "ack": 1000.0, "run": 10.0, "seen": 460.0}
    assert sum(phases.values()) == pytest.approx(1500.0)


def test_a_phase_whose_stamp_is_missing_reads_none_not_zero():
    issued = 1_800_000_000.0
    phases = command_phases(issued, issued + 0.1, record("2027-01-15T08:00:00.010Z", None, None, "2027-01-15T08:00:00.050Z"))
    assert phases["issue"] == 10.0 and phases["seen"] == 50.0
    assert phases["send"] is phases["ack"] is phases["run"] is None


def test_the_summary_names_the_phase_the_slowest_commands_waited_in():
    quick = {"issue": 5.0, "send": 1.0, "ack": 20.0, "run": 5.0, "seen": 9.0}
    timings = [CommandTiming("create_container", "succeeded", 0.04, 0.0, quick) for _ in range(198)]
    timings += [
        CommandTiming("create_container", "succeeded", 1.2, 0.0, {**quick, "ack": 1160.0}),
        CommandTiming("delete_container", "succeeded", 0.9, 0.0, {**quick, "seen": 870.0}),
        CommandTiming("create_container", "no_final_state", 30.0, 0.0, {}),  # never final: out of every figure
    ]
    summary = phase_summary(timings)
    assert summary["tail_held_in"] == {"ack": 1, "seen": 1}  # the slowest 1 % of 200 is two commands
    assert summary["ack"]["p50_ms"] == 20.0 and summary["ack"]["p99_ms"] == 20.0
    assert summary["seen"]["p99_ms"] == 9.0
    assert phase_summary([])["tail_held_in"] == {}
