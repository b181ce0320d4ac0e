"""One agent's session with this Master process, sans I/O: a frame and the clock in, a verdict out.

The session decides; the Master acts (stores, answers, sends). It knows whether the agent said hello
to this process, when it last asked for one, whether a hello is acceptable (protocol version, size of
the inventory) and whether an event report fits the agent's budget. Shaped like
agent/credentials.py: no socket, no store, no clock of its own, so every rule is a unit test.

Verdicts for the frequent frames are module constants: judging a heartbeat allocates nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from common.errors import ProtocolError
from common.wire import AgentEvent, AgentFrame, CommandAck, CommandResult, ErrorCode, Hello, negotiate
from master.budget import ReportBudget, ReportLimits, Spend

HELLO_REQUIRED = ErrorCode.HELLO_REQUIRED.value
INVENTORY_TOO_LARGE = ErrorCode.INVENTORY_TOO_LARGE.value


class Act(enum.Enum):
    TAKE = "take"  # handle the frame
    TAKE_AND_ASK_HELLO = "take_and_ask_hello"  # a command report before the hello: handle it, then ask for a hello
    ASK_HELLO = "ask_hello"  # tell the agent to say hello first (error hello_required); the frame is not taken
    IGNORE = "ignore"  # not taken, nothing said (asked for a hello moments ago)
    WELCOME = "welcome"  # a hello accepted: register the inventory, send the welcome at ``version``
    REFUSE = "refuse"  # a hello refused: send an error frame (``code``, ``message``), record it, register nothing
    DROP = "drop"  # an event report over budget: dropped and counted
    DROP_AND_NOTE = "drop_and_note"  # the first drop of a budget window: also record one note


@dataclass(frozen=True, slots=True)
class Verdict:
    act: Act
    version: int = 0
    code: str = ""
    message: str = ""


TAKE = Verdict(Act.TAKE)
TAKE_AND_ASK_HELLO = Verdict(Act.TAKE_AND_ASK_HELLO)
ASK_HELLO = Verdict(Act.ASK_HELLO)
IGNORE = Verdict(Act.IGNORE)
DROP = Verdict(Act.DROP)
DROP_AND_NOTE = Verdict(Act.DROP_AND_NOTE)


@dataclass(frozen=True, slots=True)
class SessionRules:
    """What every session of this Master checks (from MasterConfig)."""

    hello_ask_interval_s: float  # ask a gated agent for a hello at most this often
    max_gpus_per_host: int
    reports: ReportLimits


class AgentSession:
    __slots__ = ("agent_id", "_rules", "helloed", "_hello_asked_at", "budget")

    def __init__(self, agent_id: str, rules: SessionRules) -> None:
        self.agent_id = agent_id
        self._rules = rules
        self.helloed = False  # said hello to this process on its current connection
        self._hello_asked_at = float("-inf")
        # Made at the agent's first event report, which most agents never send: a budget made at the session's start
        # and not spent from would be full then all the same. None until then.
        self.budget: ReportBudget | None = None

    def receive(self, frame: AgentFrame, size: int, now: float) -> Verdict:
        """Judge one frame of ``size`` bytes from the agent, received at ``now``."""
        if isinstance(frame, Hello):
            return self._judge_hello(frame)
        if not self.helloed:
            if isinstance(frame, (CommandAck, CommandResult)):
                # Facts about commands this Master issued, true whoever asks: taken before the hello, so that
                # what a relay buffered while the Master was down (or restarting) is not thrown away.
                return TAKE_AND_ASK_HELLO if self._may_ask(now) else TAKE
            return ASK_HELLO if self._may_ask(now) else IGNORE
        if isinstance(frame, AgentEvent):
            if self.budget is None:
                self.budget = ReportBudget(self._rules.reports, now)
            spent = self.budget.spend(size, now)
            if spent is Spend.TAKEN:
                return TAKE
            return DROP_AND_NOTE if spent is Spend.DROPPED_NOTE else DROP
        return TAKE

    def welcomed(self) -> None:
        """The Master registered the hello and sent its welcome."""
        self.helloed = True
        self._hello_asked_at = float("-inf")

    def _judge_hello(self, hello: Hello) -> Verdict:
        try:
            version = negotiate(hello.versions)
        except ProtocolError as exc:
            return Verdict(Act.REFUSE, code=exc.code, message=str(exc))
        reported, limit = len(hello.inventory.gpus), self._rules.max_gpus_per_host
        if reported > limit:
            return Verdict(
                Act.REFUSE,
                code=INVENTORY_TOO_LARGE,
                message=f"the inventory lists {reported} GPUs; this Master takes at most {limit} per host",
            )
        return Verdict(Act.WELCOME, version=version)

    def _may_ask(self, now: float) -> bool:
        """At most once per interval: a relay replaying its buffer sends many frames of one agent at once,
        and each hello costs a store write and a resend of its open commands."""
        if now - self._hello_asked_at < self._rules.hello_ask_interval_s:
            return False
        self._hello_asked_at = now
        return True
