"""``python -m bench challenge`` on tiny shapes: every form's honest answer passes the Master's check, and the table
names each figure."""

from __future__ import annotations

import pytest

from bench.__main__ import main
from bench.challenge import ChallengeBenchOptions, challenge_table, run_challenge_bench


def test_the_challenge_bench_times_each_forms_check() -> None:
    result = run_challenge_bench(ChallengeBenchOptions(round_n=16, round_k=16, rounds=8, sum_n=16, sum_k=32, runs=1))
    forms = [c["form"] for c in result["checks"]]
    assert forms == ["rounds", "sum", "sum (scalar, before numpy)"]
    assert all(c["cpu_ms"] >= 0 for c in result["checks"])
    assert "CPU per check ms" in challenge_table(result)


def test_the_challenge_bench_runs_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["challenge", "--round-n", "8", "--round-k", "8", "--rounds", "4", "--sum-n", "8", "--sum-k", "8", "--runs", "1"]
    assert main(args) == 0
    assert "rounds | 8 x 8 x 4" in capsys.readouterr().out
