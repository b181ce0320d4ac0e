"""The transfer benches name the daemons whose event loop stalled (bench/tunnel.py loop_stalls), from their logs."""

from __future__ import annotations

from types import SimpleNamespace

from bench.tunnel import loop_stalls, stall_lines


def test_the_held_loop_warnings_of_every_daemon_log_are_listed_with_the_daemons_name(tmp_path):
    (tmp_path / "relay-1.log").write_text(
        "2026-11-27 12:00:00,001 relay-1 INFO access relay started\n"
        "2026-11-27 12:00:05,002 relay-1 WARNING the relay's event loop was held for 120 ms (garbage collection: 95 ms, "
        "generation 2)\n"
    )
    (tmp_path / "master.log").write_text("2026-11-27 12:00:00,001 master INFO nothing held here\n")
    grid = SimpleNamespace(logs=tmp_path)
    stalls = loop_stalls(grid)  # type: ignore[arg-type]
    assert len(stalls) == 1 and stalls[0].startswith("relay-1: ") and "held for 120 ms" in stalls[0]
    assert stall_lines({"stalls": stalls}) == ["event loops held >= 100 ms: 1", f"  {stalls[0]}"]
    assert stall_lines({"stalls": []}) == [] and stall_lines({}) == []
