"""Fuzzing the relay's per-frame path: whatever an agent sends, the relay answers with a verdict, never an exception.

The path under test is ``judge_frame`` (decode, validate, charge the sender's budget) and the envelope the relay
wraps a forwarded frame in. Inputs are arbitrary bytes and text, frames built from the wire schema, and those
frames mutated (truncated, a byte changed, a stray byte put in). Two stateful tests drive the budgets that
decide refusals: the per-agent frame budget and the per-address connection gate.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from access.ratelimit import AddressGate, Admission, FrameBudget
from access.relay import Answer, CutOff, Forward, judge_frame
from common.errors import ProtocolError
from common.wire import (
    MAX_FRAME_BYTES,
    NEVER_RATE_LIMITED,
    AgentEvent,
    CommandAck,
    CommandResult,
    ErrorCode,
    Heartbeat,
    Hello,
    Relay,
    RenewRequest,
    Telemetry,
    decode_agent_frame,
    decode_link_frame,
    decode_master_frame,
    encode,
    error_frame,
)
from common.wire import Error as ErrorFrame

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AGENT_FRAMES = (Hello, Heartbeat, Telemetry, CommandAck, CommandResult, AgentEvent, RenewRequest, ErrorFrame)
WIRE_CODES = {code.value for code in ErrorCode}

# --- strategies -----------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


def of_type(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a wire-schema type, kept small and JSON-representable (no NaN: JSON has none)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:  # a constrained type: integers within its bounds, the rest as its base type
        base, *metas = args
        if base is int:
            low = max((m.ge for m in metas if isinstance(m, msgspec.Meta) and m.ge is not None), default=-(2**63))
            high = min((m.le for m in metas if isinstance(m, msgspec.Meta) and m.le is not None), default=2**63 - 1)
            return st.integers(int(low), int(high))
        if base is float:
            metas_ = [m for m in metas if isinstance(m, msgspec.Meta)]
            low_f = max([m.ge for m in metas_ if m.ge is not None] + [m.gt for m in metas_ if m.gt is not None], default=None)
            high_f = min([m.le for m in metas_ if m.le is not None] + [m.lt for m in metas_ if m.lt is not None], default=None)
            exclude_low, exclude_high = any(m.gt is not None for m in metas_), any(m.lt is not None for m in metas_)
            return st.floats(
                low_f, high_f, allow_nan=False, allow_infinity=False, exclude_min=exclude_low, exclude_max=exclude_high
            )
        if base is str:  # a pattern or length the schema checks: valid frames keep to it (the relay refuses the rest)
            pattern = next((m.pattern for m in metas if isinstance(m, msgspec.Meta) and m.pattern is not None), None)
            shortest = max((m.min_length for m in metas if isinstance(m, msgspec.Meta) and m.min_length is not None), default=0)
            longest = min((m.max_length for m in metas if isinstance(m, msgspec.Meta) and m.max_length is not None), default=16)
            if pattern is not None:
                return st.from_regex(pattern).filter(lambda text: shortest <= len(text) <= max(longest, shortest))
            return st.text(min_size=shortest, max_size=max(min(longest, 16), shortest))
        return of_type(base)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(of_type(arg) for arg in args))
    if origin is list:
        return st.lists(of_type(args[0]), max_size=3)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(of_type(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(of_type(args[0]), of_type(args[1]), max_size=3)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return of_struct(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    simple = {
        type(None): st.none(),
        bool: st.booleans(),
        int: st.integers(-(2**63), 2**63 - 1),
        float: st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(max_size=16),
        Any: json_values,
    }
    return simple[hint]


def of_struct(cls: type[msgspec.Struct]) -> st.SearchStrategy[msgspec.Struct]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return st.builds(cls, **{f.name: of_type(hints[f.name]) for f in msgspec.structs.fields(cls)})


valid_frames = st.one_of(*(of_struct(cls) for cls in AGENT_FRAMES)).map(encode)

# Frame-shaped objects: a real or bogus type tag and fields that are real names with any JSON value.
FIELD_NAMES = sorted({f.name for cls in AGENT_FRAMES for f in msgspec.structs.fields(cls)})
TAGS = [cls.__struct_config__.tag for cls in AGENT_FRAMES]
frame_shaped = st.fixed_dictionaries(
    {"type": st.sampled_from([*TAGS, "relay", "welcome", "", "HELLO"]) | json_values},
    optional={name: json_values for name in FIELD_NAMES},
).map(msgspec.json.encode)


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(frames))
    at = draw(st.integers(0, len(data)))
    match draw(st.sampled_from(["truncate", "replace", "insert", "nest"])):
        case "truncate":
            del data[at:]
        case "replace" if data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        case "insert":
            data[at:at] = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b'"', b"\\", b"\\ud800", b"[", b"{", b","]))
        case "nest":  # deep nesting inside a free-form field: msgspec recurses
            depth = draw(st.integers(1, 50_000))
            data = bytearray(b'{"type":"command_result","id":"x","ok":true,"result":{"a":' + b"[" * depth + b"]" * depth + b"}}")
    return bytes(data)


any_message = st.one_of(st.binary(max_size=2048), valid_frames, frame_shaped, mutated(valid_frames), mutated(frame_shaped))


def rich_budget() -> FrameBudget:
    return FrameBudget(rate=1e9, burst=1e9, flood_limit=1e9, now=0.0)


# --- the per-frame path ---------------------------------------------------------------------------------------


@FUZZ
@given(any_message)
def test_any_bytes_get_a_verdict_and_never_an_exception(message: bytes) -> None:
    verdict = judge_frame(message, rich_budget(), 0.0, MAX_FRAME_BYTES)
    assert isinstance(verdict, Forward | Answer)  # a rich budget neither ignores nor cuts off
    if isinstance(verdict, Answer):
        assert verdict.error.code in WIRE_CODES


# Text as Python holds it, lone surrogates included: UTF-8 cannot encode those.
any_char = st.characters(exclude_categories=()) | st.sampled_from(["\ud800", "\udfff", "\x00", '"', "\\", "{"])
any_text = st.text(any_char, max_size=512) | st.builds(
    lambda tag, rest: f'{{"type":"{tag}",{rest}', st.sampled_from(TAGS), st.text(any_char, max_size=64)
)


@FUZZ
@given(any_text)
def test_any_text_gets_a_verdict_and_never_an_exception(message: str) -> None:
    assert isinstance(judge_frame(message, rich_budget(), 0.0, MAX_FRAME_BYTES), Forward | Answer)


@FUZZ
@given(any_message)
def test_what_the_relay_forwards_reaches_the_master_as_the_same_frame(message: bytes) -> None:
    verdict = judge_frame(message, rich_budget(), 0.0, MAX_FRAME_BYTES)
    if not isinstance(verdict, Forward):
        return
    envelope = decode_link_frame(encode(Relay(agent_id="agt-1", frame=msgspec.Raw(message))))
    assert isinstance(envelope, Relay) and envelope.agent_id == "agt-1"
    assert decode_agent_frame(bytes(envelope.frame)) == decode_agent_frame(message)
    assert verdict.kind == type(decode_agent_frame(message)).__struct_config__.tag


@FUZZ
@given(valid_frames)
def test_every_valid_frame_is_forwarded(message: bytes) -> None:
    assert isinstance(judge_frame(message, rich_budget(), 0.0, MAX_FRAME_BYTES), Forward)


@FUZZ
@given(any_message)
def test_an_error_answer_is_itself_a_frame_the_agent_can_decode(message: bytes) -> None:
    verdict = judge_frame(message, rich_budget(), 0.0, MAX_FRAME_BYTES)
    if isinstance(verdict, Answer):
        answer = decode_master_frame(error_frame(verdict.error))
        assert isinstance(answer, ErrorFrame) and answer.code == verdict.error.code


@FUZZ
@given(any_message)
def test_the_masters_decoders_raise_only_protocol_errors(message: bytes) -> None:
    for decode in (decode_link_frame, decode_master_frame, decode_agent_frame):
        try:
            decode(message)
        except ProtocolError as exc:
            assert exc.code in WIRE_CODES


@FUZZ
@given(st.integers(1, 4096), st.integers(-3, 3))
def test_the_size_limit_holds_to_the_byte(limit: int, offset: int) -> None:
    size = max(0, limit + offset)
    message = b'{"type":"event","kind":"' + b"k" * max(0, size - 26) + b'"}'
    verdict = judge_frame(message, rich_budget(), 0.0, limit)
    too_large = isinstance(verdict, Answer) and verdict.error.code == ErrorCode.FRAME_TOO_LARGE.value
    assert too_large == (len(message) > limit)


# --- budgets over time ----------------------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.floats(min_value=0.0, max_value=5.0), max_size=100), st.sampled_from(sorted(NEVER_RATE_LIMITED)))
def test_command_results_are_never_refused_only_counted(gaps: list[float], kind: str) -> None:
    budget, now = FrameBudget(rate=2.0, burst=3, flood_limit=10, now=0.0), 0.0
    message = encode(CommandAck(id="c-1")) if kind == "command_ack" else encode(CommandResult(id="c-1", ok=True))
    for gap in gaps:
        now += gap
        verdict = judge_frame(message, budget, now, MAX_FRAME_BYTES)
        assert isinstance(verdict, Forward | CutOff)
        if isinstance(verdict, CutOff):
            return  # the relay closes the connection here


@FUZZ
@given(st.lists(st.floats(min_value=0.5, max_value=3.0), max_size=200))
def test_an_agent_keeping_to_its_rate_is_never_refused(gaps: list[float]) -> None:
    budget, now = FrameBudget(rate=2.0, burst=3, flood_limit=10, now=0.0), 0.0
    for gap in gaps:
        now += gap
        assert isinstance(judge_frame(encode(Heartbeat(seq=1, ts=now)), budget, now, MAX_FRAME_BYTES), Forward)


class FrameBudgetMachine(RuleBasedStateMachine):
    """An agent sends frames of every sort at any pace; the budget must hold its promises throughout."""

    RATE, BURST, FLOOD = 10.0, 5, 20

    @initialize()
    def start(self) -> None:
        self.budget = FrameBudget(self.RATE, self.BURST, self.FLOOD, 0.0)
        self.now = 0.0
        self.limited_passed = 0
        self.cut_off = False

    @rule(seconds=st.floats(min_value=0.0, max_value=2.0))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: not self.cut_off)
    @rule(must_pass=st.booleans())
    def send(self, must_pass: bool) -> None:
        admission = self.budget.admit(self.now, must_pass=must_pass)
        if must_pass:
            assert admission is not Admission.REFUSE
        elif admission is Admission.PASS:
            self.limited_passed += 1
        self.cut_off = admission is Admission.CUT_OFF

    @invariant()
    def never_more_than_the_burst_plus_the_rate(self) -> None:
        if hasattr(self, "budget"):
            assert self.limited_passed <= self.BURST + self.RATE * self.now + 1e-6


class AddressGateMachine(RuleBasedStateMachine):
    """Connections from a few addresses open and close in any order; counts stay exact and memory follows them."""

    MAX_OPEN = 3

    @initialize()
    def start(self) -> None:
        self.clock = 0.0
        self.gate = AddressGate(self.MAX_OPEN, rate=1.0, burst=4, max_keys=2, clock=lambda: self.clock)
        self.held: dict[str, int] = {}

    @rule(address=st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "::1"]))
    def connect(self, address: str) -> None:
        before = self.held.get(address, 0)
        reason = self.gate.admit(address)
        if before >= self.MAX_OPEN:
            assert reason == "ip_connections"
        if reason is None:
            self.held[address] = before + 1

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        address = data.draw(st.sampled_from(sorted(a for a, n in self.held.items() if n)))
        self.gate.release(address)
        self.held[address] -= 1

    @rule(seconds=st.floats(min_value=0.0, max_value=10.0))
    def wait(self, seconds: float) -> None:
        self.clock += seconds

    @invariant()
    def counts_are_exact_and_only_held_addresses_are_remembered(self) -> None:
        if hasattr(self, "gate"):
            for address, count in self.held.items():
                assert self.gate.holding(address) == count <= self.MAX_OPEN
            assert set(self.gate._open) == {a for a, n in self.held.items() if n}


TestFrameBudget = FrameBudgetMachine.TestCase
TestFrameBudget.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestAddressGate = AddressGateMachine.TestCase
TestAddressGate.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_an_endpoint_workers_calls_spend_their_own_budget_and_not_the_hosts_frames():
    """A host's worker calls (an endpoint serving many requests) past the host's frame budget still pass on their own
    budget, and they leave the host's budget whole for its heartbeats; past their own budget they are refused too."""
    from common.wire import WorkerCall, WorkerOp

    frames, workers = (
        FrameBudget(rate=1, burst=2, flood_limit=100, now=0.0),
        FrameBudget(rate=1, burst=5, flood_limit=100, now=0.0),
    )
    call = encode(WorkerCall(call_id="c", container="w", endpoint_id="ep-a", worker_id="wk-1", op=WorkerOp.TAKE))
    assert [type(judge_frame(call, frames, 0.0, MAX_FRAME_BYTES, workers)) for _ in range(6)] == [Forward] * 5 + [Answer]
    heartbeat = encode(Heartbeat(seq=1, ts=0.0))
    assert [type(judge_frame(heartbeat, frames, 0.0, MAX_FRAME_BYTES, workers)) for _ in range(3)] == [Forward] * 2 + [Answer]
    assert isinstance(judge_frame(call, frames, 0.0, MAX_FRAME_BYTES), Answer)  # without a budget of their own: the host's
