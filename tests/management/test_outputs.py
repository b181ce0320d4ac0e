"""The output collector's decision for one pending output (management/services/outputs.py ``decide``), rule by rule, and the
book's ``settle`` that ends a replica's ``deleting``; and what a failed workload's reason shows of its output
(``reason_tail``: its last 3 printable lines, 300 characters at most)."""

from __future__ import annotations

from typing import Any

from management.services.outputs import Lose, OutputSettings, Read, Wait, decide, reason_tail
from master.records import AgentRecord, CommandRecord, KeptOutput

SETTINGS = OutputSettings(give_up_s=100.0, max_tries=3)
NOW = 1000.0


def pending(**fields: Any) -> KeptOutput:
    base: dict[str, Any] = {
        "id": "wl-1:r0:a1",
        "workload_id": "wl-1",
        "account": "alice",
        "replica": 0,
        "attempt": 1,
        "agent_id": "agt-1",
        "container": "wl-1-r0-a1",
        "ended_at": NOW - 10,
    }
    return KeptOutput(**(base | fields))


def host(state: str = "busy", containers: tuple[str, ...] = ()) -> AgentRecord:
    return AgentRecord(id="agt-1", provider="p", state=state, containers={name: [] for name in containers})


def delete(state: str = "succeeded", result: dict[str, Any] | None = None) -> CommandRecord:
    if result is None and state == "succeeded":
        result = {"container": {"name": "wl-1-r0-a1", "exit_code": 3}, "output": {"bytes": 10, "kept": 10, "truncated": False}}
    return CommandRecord(
        id="c-1", agent_id="agt-1", kind="delete_container", spec={"name": "wl-1-r0-a1"}, state=state, created_at=NOW - 9,
        deadline=NOW + 60, result=result,
    )  # fmt: skip


def test_a_done_delete_whose_host_kept_output_is_read_with_the_exit_status_it_reported() -> None:
    assert decide(pending(), host(), True, delete(), NOW, SETTINGS) == Read(exit_code=3)


def test_a_delete_under_way_or_a_container_still_listed_waits() -> None:
    assert isinstance(decide(pending(), host(), True, delete("acked"), NOW, SETTINGS), Wait)
    assert isinstance(decide(pending(), host(containers=("wl-1-r0-a1",)), True, delete(), NOW, SETTINGS), Wait)


def test_a_host_that_is_offline_is_waited_for_until_the_give_up_time() -> None:
    assert decide(pending(), host("offline"), False, delete(), NOW, SETTINGS) == Wait("host agt-1 is not connected")
    late = decide(pending(ended_at=NOW - 101), host("offline"), False, delete(), NOW, SETTINGS)
    assert late == Lose("host agt-1 is not connected after 100 s")


def test_a_host_gone_from_the_grid_loses_the_output_with_the_reason() -> None:
    assert decide(pending(), None, False, None, NOW, SETTINGS) == Lose("host agt-1 left the grid before its output could be read")
    assert isinstance(decide(pending(), host("retired"), False, None, NOW, SETTINGS), Lose)


def test_a_container_that_was_not_there_when_deleted_has_no_output() -> None:
    nothing = delete(result={"container": None})
    assert decide(pending(), host(), True, nothing, NOW, SETTINGS) == Lose(
        "the container was not on its host when it was deleted (it had not started)"
    )


def test_reads_that_keep_failing_are_given_up_after_max_tries() -> None:
    assert decide(pending(tries=2), host(), True, delete(), NOW, SETTINGS) == Read(exit_code=3)
    assert decide(pending(tries=3), host(), True, delete(), NOW, SETTINGS) == Lose("reading it from host agt-1 failed 3 times")


def test_without_a_delete_found_a_container_gone_from_its_host_is_read() -> None:
    """A Master killed between storing the pending output and sending the delete: the stray sweep's delete (or none
    the collector can find among the host's newest commands) still lets the output be read once the container left."""
    assert decide(pending(), host(), True, None, NOW, SETTINGS) == Read(exit_code=None)


def test_a_failure_reason_carries_the_last_three_printable_lines() -> None:
    output = b"epoch 1\nepoch 2\n\x1b[31mTraceback\x1b[0m (most recent call last):\n\tKeyError:\x07 'lr'\x00\n\n"
    assert reason_tail(output, 3, 300) == "epoch 2\nTraceback (most recent call last):\nKeyError: 'lr'"


def test_a_progress_bar_counts_as_drawn_last_and_blank_lines_do_not_count() -> None:
    assert reason_tail(b"loading\n 10%\r 55%\r100% done\r\n\n\n\nexit\n", 3, 300) == "loading\n100% done\nexit"


def test_a_failure_reason_is_at_most_300_characters_the_last_ones() -> None:
    tail = reason_tail(b"first\n" + b"y" * 1000 + b"\nRuntimeError: out of memory\n", 3, 300)
    assert len(tail) == 300 and tail.startswith("…") and tail.endswith("y\nRuntimeError: out of memory")
    assert "first" not in tail


def test_no_printable_output_gives_no_lines() -> None:
    assert reason_tail(b"", 3, 300) == "" and reason_tail(b"\x1b[2J\r\n\t\n", 3, 300) == ""
