"""The agent session, sans I/O: a frame and the clock in, a verdict out. No socket, no store."""

from __future__ import annotations

from common.wire import AgentEvent, AgentEventKind, CommandResult, Heartbeat, Hello, WorkerCall, WorkerOp
from master.budget import ReportLimits
from master.session import INVENTORY_TOO_LARGE, Act, AgentSession, SessionRules
from tests.master.linked import gpus, hello

RULES = SessionRules(hello_ask_interval_s=5.0, max_gpus_per_host=16, reports=ReportLimits(3, 10_000, 60.0))
HEARTBEAT = Heartbeat(seq=1, ts=0.0)


def report(message: str = "") -> AgentEvent:
    return AgentEvent(kind=AgentEventKind.GPU_XID, ts=0.0, code=79, message=message)


def welcomed(now: float = 0.0) -> AgentSession:
    session = AgentSession("agt-a", RULES)
    assert session.receive(hello(gpus(2)), 500, now).act is Act.WELCOME
    session.welcomed()
    return session


def test_frames_before_the_hello_ask_for_one_at_most_once_per_interval():
    session = AgentSession("agt-a", RULES)
    assert session.receive(HEARTBEAT, 40, 0.0).act is Act.ASK_HELLO
    assert session.receive(HEARTBEAT, 40, 1.0).act is Act.IGNORE
    assert session.receive(HEARTBEAT, 40, 5.0).act is Act.ASK_HELLO


def test_command_results_before_the_hello_are_taken_so_buffered_results_are_not_lost():
    session = AgentSession("agt-a", RULES)
    assert session.receive(CommandResult(id="cmd-1", ok=True), 40, 0.0).act is Act.TAKE_AND_ASK_HELLO
    assert session.receive(CommandResult(id="cmd-2", ok=True), 40, 0.1).act is Act.TAKE


def test_after_the_welcome_frames_are_taken_and_a_heartbeat_allocates_no_verdict():
    session = welcomed()
    first, second = session.receive(HEARTBEAT, 40, 1.0), session.receive(HEARTBEAT, 40, 2.0)
    assert first.act is Act.TAKE and first is second


def test_a_hello_listing_more_gpus_than_a_host_may_have_is_refused_with_a_clear_error():
    verdict = AgentSession("agt-a", RULES).receive(hello(gpus(17)), 9_000, 0.0)
    assert verdict.act is Act.REFUSE and verdict.code == INVENTORY_TOO_LARGE
    assert verdict.message == "the inventory lists 17 GPUs; this Master takes at most 16 per host"
    assert AgentSession("agt-a", RULES).receive(hello(gpus(16)), 9_000, 0.0).act is Act.WELCOME


def test_a_hello_in_no_protocol_version_this_master_speaks_is_refused():
    stale = Hello(versions=[99], agent_version="x", inventory=hello(gpus(1)).inventory)
    verdict = AgentSession("agt-a", RULES).receive(stale, 500, 0.0)
    assert verdict.act is Act.REFUSE and verdict.code == "unsupported_version"


def test_event_reports_over_the_budget_are_dropped_and_noted_once_per_window():
    session = welcomed()
    acts = [session.receive(report(), 100, 1.0).act for _ in range(6)]
    assert acts == [Act.TAKE] * 3 + [Act.DROP_AND_NOTE, Act.DROP, Act.DROP]
    assert session.budget is not None and session.budget.dropped == 3
    # 20 s later one report's worth of tokens is back (3 per 60 s); the window of the note has not passed.
    assert session.receive(report(), 100, 21.0).act is Act.TAKE
    assert session.receive(report(), 100, 21.0).act is Act.DROP
    # At 62 s two more have come back, and a new window began: the next drop is noted again.
    assert [session.receive(report(), 100, 62.0).act for _ in range(4)] == [Act.TAKE, Act.TAKE, Act.DROP_AND_NOTE, Act.DROP]


def test_event_reports_are_budgeted_by_bytes_too():
    session = welcomed()
    assert session.receive(report(), 9_000, 0.0).act is Act.TAKE
    assert session.receive(report(), 2_000, 0.0).act is Act.DROP_AND_NOTE  # 11,000 bytes > 10,000 per window
    assert session.budget is not None and session.budget.dropped_bytes == 2_000


def test_a_worker_call_is_taken_only_after_the_welcome_and_is_not_budgeted_as_a_report():
    """A call before the hello is not passed on (the Master does not know the host yet: its worker's call times out
    at the agent, a 503 the worker retries); after it, every call is taken, however many: the worker API's own
    retries pace them, and a report budget would drop a result."""
    call = WorkerCall(call_id="c-1", container="w-c", endpoint_id="ep-a", worker_id="w-1", op=WorkerOp.HEARTBEAT)
    assert AgentSession("agt-a", RULES).receive(call, 100, 0.0).act is Act.ASK_HELLO
    session = welcomed()
    assert all(session.receive(call, 100_000, 1.0).act is Act.TAKE for _ in range(10))
