"""Each frame a relay queues for the Master declares its lane once, beside its fields (common/wire.py), and the relay
(access/upstream.py, access/relay.py) and the Master's intake (master/intake.py) sort by that declaration alone."""

from typing import ClassVar, get_args

import msgspec
import pytest

from access.relay import Forward, judge_frame
from access.upstream import FrameBuffer, Outbound
from common.lanes import Lane
from common.wire import (
    FOLDED_KINDS,
    LANE_OF_KIND,
    MAX_FRAME_BYTES,
    NEVER_RATE_LIMITED,
    QUEUED_FRAMES,
    TELEMETRY_KINDS,
    AgentFrame,
    AgentReports,
    FrameWithoutLane,
    Relay,
    ReportFold,
    Telemetry,
    _Frame,
    decode_link_frame,
    encode,
    lanes_of,
    tag_of,
)
from master.intake import lane_of


class Undeclared(_Frame, tag="undeclared"):
    note: str = ""


class Declared(_Frame, tag="declared"):
    lane: ClassVar[Lane] = Lane.TELEMETRY


def test_a_frame_without_a_lane_is_named():
    with pytest.raises(FrameWithoutLane, match="Undeclared .'undeclared'. declares no lane"):
        lanes_of([Declared, Undeclared])
    assert lanes_of([Declared]) == {"declared": Lane.TELEMETRY}


@pytest.mark.parametrize("frame", QUEUED_FRAMES, ids=tag_of)
def test_every_frame_a_relay_queues_declares_its_own_lane(frame):
    assert isinstance(vars(frame).get("lane"), Lane), f"{frame.__name__} declares no lane of its own"
    assert LANE_OF_KIND[tag_of(frame)] is frame.lane


def test_every_agent_frame_is_queued_with_a_lane():
    assert {tag_of(frame) for frame in get_args(AgentFrame)} <= LANE_OF_KIND.keys()


def test_the_lanes_declared_today():
    """A change here is a change of behaviour at the relay and the Master's door: docs/overload.md says why each is where."""
    assert {kind for kind, lane in LANE_OF_KIND.items() if lane is Lane.TELEMETRY} == {"heartbeat", "telemetry", "report_fold"}
    assert FOLDED_KINDS == {"heartbeat", "telemetry"}
    assert {kind for kind, lane in LANE_OF_KIND.items() if lane is Lane.ADMISSION} == {"hello"}
    assert NEVER_RATE_LIMITED == {"command_ack", "command_result"}


def relayed(kind: str) -> bytes:
    return encode(Relay(agent_id="a1", frame=msgspec.Raw(b'{"type":"' + kind.encode() + b'"}')))


@pytest.mark.parametrize("kind", sorted(tag_of(frame) for frame in get_args(AgentFrame)))
def test_the_masters_intake_puts_each_agent_frame_in_its_declared_lane(kind):
    lane, key, _ = lane_of(decode_link_frame(relayed(kind)))
    assert lane is LANE_OF_KIND[kind]
    assert key == (("a1", kind) if kind in TELEMETRY_KINDS else None)


def test_the_relay_sends_each_kind_in_its_declared_lanes_order():
    buffer = FrameBuffer(limit=100)
    for kind in sorted(LANE_OF_KIND, key=lambda k: -LANE_OF_KIND[k]):  # telemetry first, control last
        assert buffer.offer(Outbound("a1", kind, b"{}"))
    sent = [kind for _, kind in buffer.kinds()]
    assert [LANE_OF_KIND[kind] for kind in sent] == sorted(LANE_OF_KIND[kind] for kind in sent)
    assert len(sent) == len(LANE_OF_KIND)


def test_the_relay_never_refuses_what_is_declared_never_rate_limited():
    from access.ratelimit import FrameBudget

    exhausted = FrameBudget(rate=0.001, burst=1, flood_limit=1000, now=0.0)
    assert isinstance(judge_frame(encode_kind("heartbeat"), exhausted, 0.0, MAX_FRAME_BYTES), Forward)  # the one burst
    assert not isinstance(judge_frame(encode_kind("heartbeat"), exhausted, 0.0, MAX_FRAME_BYTES), Forward)
    for kind in NEVER_RATE_LIMITED:
        assert isinstance(judge_frame(encode_kind(kind), exhausted, 0.0, MAX_FRAME_BYTES), Forward)


def encode_kind(kind: str) -> bytes:
    fields: dict[str, dict[str, object]] = {
        "heartbeat": {"seq": 1, "ts": 0.0},
        "command_ack": {"id": "c1"},
        "command_result": {"id": "c1", "ok": True},
    }
    return msgspec.json.encode({"type": kind, **fields[kind]})


async def test_the_relay_and_the_masters_intake_queue_on_the_one_lane_queue():
    """Issue 38, point 2: one lane queue (common/lanes.py), under the relay's buffer and under each link's intake."""
    from common.lanes import LaneBounds, LaneQueue
    from master.intake import IntakeCounters, LinkIntake

    async def ignore(_: object) -> None:
        return None

    assert type(FrameBuffer(limit=10).queue) is LaneQueue
    assert type(LinkIntake(ignore, ignore, LaneBounds(), IntakeCounters()).queue) is LaneQueue


def test_a_fold_waits_in_the_telemetry_lane_at_both_ends_and_is_never_replaced_by_the_next():
    fold = ReportFold(alive=["a1", "a2"], reports=[AgentReports(agent_id="a3", frames=[Telemetry(ts=1.0, samples=[])])])
    lane, key, size = lane_of(decode_link_frame(encode(fold)))
    assert (lane, key) == (Lane.TELEMETRY, None)
    assert size > 0
    buffer = FrameBuffer(limit=100)
    buffer.coalesce = True  # as while the Master is away: an agent's newer heartbeat replaces its older one
    assert buffer.offer(Outbound("", "report_fold", encode(fold)))
    assert buffer.offer(Outbound("", "report_fold", encode(fold)))
    assert buffer.kinds() == [("", "report_fold"), ("", "report_fold")]
