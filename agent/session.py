"""This agent's session with the Master, sans I/O: a message from the relay in, one action out.

The other side of master/session.py. The session decides what each frame from the Master means and what the agent
sends because of it; the daemon (agent/daemon.py) holds the connection and only carries the action out, one
``match`` and one method per action, in the part that owns it (the executor's ledger, the tunnel server, the
renewal timer, the relay directory). No socket, no clock, no task: every rule is a unit test
(tests/agent/test_session.py).

What it owns, for the life of the agent process:

- whether the agent is stopping (``stop``), and which command ids run now (``running``);
- the report intervals the Master set (a welcome, or a config frame), and what the next heartbeat says: its
  sequence number and the nonce of the last ping;
- whether the relay says the Master is out of reach (``relay_degraded``; a new connection starts trusting it).

Actions, the closed set ``Action``; each frame kind leads to one:

    message not a frame of the Master's     BadFrame(error)              logged, nothing sent (a report interval
                                                                         of 0 or less, or over a week, is no frame)
    welcome                                 Welcomed(welcome)            intervals set here; keys, directory, renewal
    command, new                            RunCommand(command)          ack it, run it once, send its result
    command, running here now               AckCommand(id)               ack it; its result follows when it ends
    command, while stopping                 NOTHING                      not acked: the Master resends it later
    result_ack                              ResultAcked(id)              the ledger stops resending that result
    tunnel_open                             OpenTunnel(frame)            the tunnel server checks the ticket
    tunnel_open, while stopping             RefuseTunnel(ticket id)      logged, nothing dialled
    relay_status                            RelayReported(status, ...)   ``relay_degraded`` set here; logged; up again
                                                                         before a welcome: the hello again
    relay_directory                         NewDirectory(relays)         the connector ranks it, kept on disk
    config                                  NewKeys(...)                 intervals set here (0 or absent: kept)
    renew_response                          RenewalAnswered(response)    the renewer installs the certificate
    verify_challenge                        Challenged(challenge)        the benchmark answers with a commit
    verify_reveal                           RevealAsked(reveal)          the benchmark opens the committed rows
    worker_answer                           WorkerAnswered(answer)       the worker API server answers the call
    ping                                    NOTHING                      the next heartbeat echoes its nonce
    error hello_required                    SEND_HELLO                   the inventory again
    any other error                         MasterError(code, message)   logged

Invariants, each a test:

1. ``receive`` never raises: whatever the relay sends, the answer is an action.
2. A command id is handed to the executor (``RunCommand``) at most once while it runs: a resend while it runs is
   only acked, whatever the order of resends, acks and ends (a property). Across runs, the executor's ledger
   (agent/ledger.py) answers a finished id from what it kept, a refused one included (agent/executor.py), so a
   command is executed at most once in all, and never after a copy of it was refused.
3. Every command received, unless the agent is stopping, is acked exactly once per receipt.
4. Once stopping, no command is acked or run and no tunnel opens.
5. Heartbeat sequence numbers only grow, across connections too.
6. An interval changes only by a welcome (which sets both) or a config frame (which keeps one it leaves absent or
   zero).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from common.errors import ProtocolError
from common.wire import (
    Command,
    Config,
    Error,
    ErrorCode,
    Heartbeat,
    Ping,
    RelayDirectory,
    RelayEntry,
    RelayStatus,
    RenewResponse,
    ResultAck,
    TunnelOpen,
    VerifyChallenge,
    VerifyReveal,
    Welcome,
    WorkerAnswer,
    decode_master_frame,
)

HELLO_REQUIRED = ErrorCode.HELLO_REQUIRED.value
MASTER_LINK_UP = "up"  # RelayStatus.master_link when the relay reaches the Master
DEFAULT_HEARTBEAT_S = 5.0  # until the welcome says otherwise
DEFAULT_TELEMETRY_S = 10.0


@dataclass(frozen=True, slots=True)
class Nothing:
    """The session took the frame itself (a ping), or holds it (a command while stopping): nothing to carry out."""


@dataclass(frozen=True, slots=True)
class SendHello:
    """The Master asks for the inventory again (its session with this agent started afresh)."""


@dataclass(frozen=True, slots=True)
class BadFrame:
    error: ProtocolError


@dataclass(frozen=True, slots=True)
class Welcomed:
    welcome: Welcome


@dataclass(frozen=True, slots=True)
class RunCommand:
    command: Command


@dataclass(frozen=True, slots=True)
class AckCommand:
    command_id: str


@dataclass(frozen=True, slots=True)
class ResultAcked:
    command_id: str


@dataclass(frozen=True, slots=True)
class OpenTunnel:
    frame: TunnelOpen


@dataclass(frozen=True, slots=True)
class RefuseTunnel:
    ticket_id: str


@dataclass(frozen=True, slots=True)
class RelayReported:
    status: RelayStatus
    degraded: bool  # the relay cannot reach the Master: what the agent sends waits in its buffer
    # The Master is reachable again and has not welcomed this connection: the hello may have died with the Master
    # that took it (a leader SIGKILLed mid-hello; its successor never heard it), so it goes again.
    hello_again: bool = False


@dataclass(frozen=True, slots=True)
class NewDirectory:
    relays: list[RelayEntry]


@dataclass(frozen=True, slots=True)
class NewKeys:
    keys: dict[str, str]
    endorsements: dict[str, str]
    retired: list[str]


@dataclass(frozen=True, slots=True)
class RenewalAnswered:
    response: RenewResponse


@dataclass(frozen=True, slots=True)
class Challenged:
    challenge: VerifyChallenge


@dataclass(frozen=True, slots=True)
class RevealAsked:
    reveal: VerifyReveal


@dataclass(frozen=True, slots=True)
class WorkerAnswered:
    answer: WorkerAnswer


@dataclass(frozen=True, slots=True)
class MasterError:
    code: str
    message: str


Action = (
    Nothing
    | SendHello
    | BadFrame
    | Welcomed
    | RunCommand
    | AckCommand
    | ResultAcked
    | OpenTunnel
    | RefuseTunnel
    | RelayReported
    | NewDirectory
    | NewKeys
    | RenewalAnswered
    | Challenged
    | RevealAsked
    | WorkerAnswered
    | MasterError
)

NOTHING = Nothing()
SEND_HELLO = SendHello()


class MasterSession:
    """One per agent process, across its connections: the daemon hands it every message and carries out the action."""

    __slots__ = ("heartbeat_s", "telemetry_s", "relay_degraded", "running", "welcomed", "_stopping", "_ping", "_seq")

    def __init__(self, *, heartbeat_s: float = DEFAULT_HEARTBEAT_S, telemetry_s: float = DEFAULT_TELEMETRY_S) -> None:
        self.heartbeat_s = heartbeat_s
        self.telemetry_s = telemetry_s
        self.relay_degraded = False
        self.running: set[str] = set()  # command ids handed to the executor and not ended yet
        self.welcomed = False  # the Master welcomed the current connection
        self._stopping = False
        self._ping: str | None = None  # the nonce of the last ping, echoed by every heartbeat after it
        self._seq = itertools.count(1)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """From now on no command is taken and no tunnel opened; running commands still end and report."""
        self._stopping = True

    def connection_opened(self) -> None:
        """A new relay: it says at once if it cannot reach the Master."""
        self.relay_degraded = False
        self.welcomed = False

    def receive(self, message: str | bytes) -> Action:
        """Decode one message from the relay and judge it. Never raises."""
        try:
            frame = decode_master_frame(message)
        except ProtocolError as exc:
            return BadFrame(exc)
        match frame:
            case Command():
                return self._judge_command(frame)
            case ResultAck():
                return ResultAcked(frame.id)
            case Ping():
                self._ping = frame.nonce
                return NOTHING
            case Welcome():
                self.heartbeat_s, self.telemetry_s = frame.heartbeat_s, frame.telemetry_s
                self.welcomed = True
                return Welcomed(frame)
            case Config():
                # Absent or zero: the interval stays (a config frame about keys names none).
                self.heartbeat_s = frame.heartbeat_s or self.heartbeat_s
                self.telemetry_s = frame.telemetry_s or self.telemetry_s
                return NewKeys(frame.command_keys or {}, frame.key_endorsements or {}, frame.retired_keys or [])
            case TunnelOpen():
                return RefuseTunnel(frame.ticket.body.id) if self._stopping else OpenTunnel(frame)
            case RelayStatus():
                self.relay_degraded = frame.master_link != MASTER_LINK_UP
                again = not self.relay_degraded and not self.welcomed and not self._stopping
                return RelayReported(frame, self.relay_degraded, hello_again=again)
            case RelayDirectory():
                return NewDirectory(frame.relays)
            case RenewResponse():
                return RenewalAnswered(frame)
            case VerifyChallenge():
                return Challenged(frame)
            case VerifyReveal():
                return RevealAsked(frame)
            case WorkerAnswer():
                return WorkerAnswered(frame)
            case Error() if frame.code == HELLO_REQUIRED:
                return SEND_HELLO
            case Error():
                return MasterError(frame.code, frame.message)

    def command_ended(self, command_id: str) -> None:
        """The executor returned (or gave up on) ``command_id``: a resend from now on runs it again, and the
        executor's ledger answers it from what it kept."""
        self.running.discard(command_id)

    def heartbeat(
        self,
        ts: float,
        running: list[str],
        exited: dict[str, int] | None = None,
        overlay: dict[str, dict[str, str]] | None = None,
    ) -> Heartbeat:
        """The next heartbeat: what the host runs, numbered after the last, echoing the last ping."""
        return Heartbeat(
            seq=next(self._seq),
            ts=ts,
            running=running,
            exited=exited if exited is not None else {},
            ping=self._ping,
            overlay=overlay if overlay is not None else {},
        )

    def _judge_command(self, command: Command) -> Action:
        if self._stopping:
            return NOTHING
        command_id = command.body.id
        if command_id in self.running:
            return AckCommand(command_id)
        self.running.add(command_id)
        return RunCommand(command)
