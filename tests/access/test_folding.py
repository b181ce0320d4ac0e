"""Folding (access/fold.py, docs/access.md "Folding"): to a Master that takes folds, a relay's agents' heartbeats and
telemetry go as one ``report_fold`` per interval; commands' results keep their own lane and never wait for a fold; an
older Master gets every frame on its own; a fold never grows past its bounds."""

from __future__ import annotations

import json

from access.fold import ReportFolder
from access.upstream import FrameBuffer, Outbound
from common.inventory import GpuSample
from common.wire import Heartbeat, Relay, ReportFold, Telemetry, encode
from tests.access.conftest import heartbeat, result
from tests.support.prometheus import sample


def beat(seq: int, running: list[str] | None = None) -> Heartbeat:
    return Heartbeat(seq=seq, ts=float(seq), running=running or [])


def telemetry(ts: float, gpus: int = 1) -> Telemetry:
    return Telemetry(ts=ts, samples=[GpuSample(uuid=f"GPU-{n}", ts=ts) for n in range(gpus)])


# --- the fold, sans I/O --------------------------------------------------------------------------


def test_a_heartbeat_that_says_nothing_new_is_folded_as_alive_and_a_change_in_full():
    folder = ReportFolder(max_samples=100, max_bytes=1 << 20)
    folder.add("a1", beat(1), 50)
    first = folder.take()
    assert first is not None and first.alive == [] and [r.frames for r in first.reports] == [[beat(1)]]

    folder.add("a1", beat(2), 50)  # the same content, a later seq and date
    folder.add("a2", beat(2), 50)  # never told: in full
    second = folder.take()
    assert second is not None and second.alive == ["a1"]
    assert [(r.agent_id, r.frames) for r in second.reports] == [("a2", [beat(2)])]

    folder.add("a1", beat(3, running=["c1"]), 50)  # a change
    third = folder.take()
    assert third is not None and third.alive == [] and third.reports[0].frames == [beat(3, running=["c1"])]
    assert folder.take() is None  # nothing waits


def test_an_agents_frames_keep_their_order_and_every_telemetry_sample_goes():
    folder = ReportFolder(max_samples=100, max_bytes=1 << 20)
    folder.add("a1", beat(1), 50)
    folder.take()
    folder.add("a1", beat(2), 50)  # unchanged, first in the interval: alive
    folder.add("a1", telemetry(2.0), 80)
    folder.add("a1", beat(3), 50)  # unchanged, but after a telemetry frame: in full, in its place
    folder.add("a1", telemetry(3.0), 80)
    fold = folder.take()
    assert fold is not None and fold.alive == ["a1"]
    assert fold.reports[0].frames == [telemetry(2.0), beat(3), telemetry(3.0)]


def test_a_fold_says_when_it_is_full_by_samples_or_bytes():
    folder = ReportFolder(max_samples=5, max_bytes=1 << 20)
    assert not folder.add("a1", telemetry(1.0, gpus=2), 80)
    assert folder.add("a2", telemetry(1.0, gpus=3), 80)
    folder.take()
    assert not folder.full  # the next one starts empty
    by_bytes = ReportFolder(max_samples=1000, max_bytes=200)
    assert not by_bytes.add("a1", telemetry(1.0), 150)
    assert by_bytes.add("a2", telemetry(1.0), 150)


def test_a_reset_a_hello_or_a_departure_makes_the_next_heartbeat_go_in_full():
    folder = ReportFolder(max_samples=100, max_bytes=1 << 20)
    for agent in ("a1", "a2", "a3"):
        folder.add(agent, beat(1), 50)
    folder.take()
    folder.add("a1", beat(2), 50)  # alive, then its hello: in full, first
    folder.renew("a1")
    folder.forget("a2")  # it left: nothing of it waits, and what it said is forgotten
    folder.add("a2", beat(2), 50)
    fold = folder.take()
    assert fold is not None and fold.alive == []
    assert {r.agent_id: r.frames for r in fold.reports} == {"a1": [beat(2)], "a2": [beat(2)]}
    folder.reset()  # a new Master link, or a fold shed on the way
    folder.add("a3", beat(3), 50)
    fold = folder.take()
    assert fold is not None and fold.alive == [] and fold.reports[0].frames == [beat(3)]


def test_unfold_gives_back_the_agents_own_frames_in_their_order():
    folder = ReportFolder(max_samples=100, max_bytes=1 << 20)
    folder.add("a1", beat(1), 50)
    folder.take()
    folder.add("a1", beat(2), 50)
    folder.add("a1", telemetry(2.0), 80)
    assert folder.unfold() == [("a1", beat(2)), ("a1", telemetry(2.0))]
    assert folder.take() is None
    folder.add("a1", beat(3), 50)  # what was told is forgotten: in full
    fold = folder.take()
    assert fold is not None and fold.reports[0].frames == [beat(3)]


# --- a real relay ----------------------------------------------------------------------------------


def folds(master) -> list[ReportFold]:
    return master.of_type(ReportFold)


async def test_to_a_master_that_takes_folds_reports_go_folded_and_a_result_goes_at_once(make_relay, master, pki, open_agent):
    master.folds = True
    relay = await make_relay(fold_interval_s=5.0)  # far longer than the result may take
    assert master.hellos[-1].folds and relay.link.folding
    agent = pki.agent()
    agent_id = agent.identity.id
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await ws.send(json.dumps({"type": "telemetry", "ts": 1.0, "samples": [{"uuid": "GPU-1", "ts": 1.0}]}))
        await ws.send(result("cmd-1"))
        await master.wait_for(lambda: master.relayed(agent_id), "the result")
        assert [frame["type"] for _, frame in master.relayed(agent_id)] == ["command_result"]
        assert folds(master) == []  # the heartbeat and telemetry wait for the interval's end; the result did not
        await relay.link.flush(3.0)  # as a stopping relay does: the fold goes now
        [fold] = folds(master)
        assert fold.alive == [] and [type(f) for f in fold.reports[0].frames] == [Heartbeat, Telemetry]
        await ws.send(heartbeat(2))
        await master.wait_for(lambda: len(relay.link.folder) == 1, "the second heartbeat folded")
        await relay.link.flush(3.0)
        assert folds(master)[-1].alive == [agent_id] and folds(master)[-1].reports == []
    text = relay.metrics.render().decode()
    assert sample(text, "idlegrid_access_report_folds_total") == 2
    assert sample(text, "idlegrid_access_frames_in_total", type="heartbeat") == 2


async def test_an_older_master_gets_every_frame_on_its_own(make_relay, master, pki, open_agent):
    relay = await make_relay(fold_interval_s=0.05)  # the stand-in's welcome says no folds, as an older Master's does
    assert master.hellos[-1].folds and not relay.link.folding
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        for seq in range(3):
            await ws.send(heartbeat(seq))
        await master.wait_for(lambda: len(master.relayed()) == 3, "three heartbeats")
    assert folds(master) == []


async def test_folding_can_be_turned_off(make_relay, master, pki, open_agent):
    master.folds = True
    relay = await make_relay(fold_interval_s=0)
    assert not master.hellos[-1].folds and not relay.link.folding
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the heartbeat")
    assert folds(master) == []


async def test_a_full_fold_goes_before_its_interval_ends(make_relay, master, pki, open_agent):
    master.folds = True
    relay = await make_relay(fold_interval_s=10.0, fold_max_samples=3)
    async with open_agent(relay, pki.agent()) as ws:
        samples = [{"uuid": f"GPU-{n}", "ts": 1.0} for n in range(2)]
        for ts in (1.0, 2.0):
            await ws.send(json.dumps({"type": "telemetry", "ts": ts, "samples": samples}))
        await master.wait_for(lambda: folds(master), "the full fold")
    [fold] = folds(master)
    assert [len(f.samples) for f in fold.reports[0].frames if isinstance(f, Telemetry)] == [2, 2]


async def test_what_waits_in_the_fold_when_the_link_drops_goes_unfolded_to_the_next_master(make_relay, master, pki, open_agent):
    master.folds = True
    relay = await make_relay(fold_interval_s=10.0)
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(7))
        await master.wait_for(lambda: relay.link.folder.samples == 1, "the heartbeat folded")
        await master.stop()  # the Master goes; the one that comes back is older: it takes no folds
        await master.wait_for(lambda: not relay.link.is_up, "the link down")
        master.folds = False
        await master.start()
        await relay.link.wait_up(5)
        await master.wait_for(lambda: master.relayed(agent.identity.id), "the heartbeat")
    assert [frame["seq"] for _, frame in master.relayed(agent.identity.id)] == [7]
    assert not relay.link.folding and folds(master) == []
    assert all(not isinstance(f, Relay) or json.loads(bytes(f.frame))["type"] != "report_fold" for f in master.frames)


def test_folds_waiting_for_a_master_that_takes_none_are_let_go_counted_and_the_fold_forgets_what_it_told():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=100, on_drop=dropped.append)
    folder = ReportFolder(max_samples=100, max_bytes=1 << 20)
    buffer.on_shed = folder.reset
    folder.add("a1", beat(1), 50)
    waiting = folder.take()
    assert waiting is not None
    buffer.offer(Outbound("", "report_fold", encode(waiting)))
    buffer.offer(Outbound("a2", "heartbeat", b"{}"))

    assert buffer.discard_folds() == 1

    assert buffer.kinds() == [("a2", "heartbeat")]
    assert dropped == ["evicted"] and buffer.telemetry_shed == 1
    folder.add("a1", beat(2), 50)  # the Master never had a1's heartbeat: in full, not alive
    fold = folder.take()
    assert fold is not None and fold.alive == [] and fold.reports[0].frames == [beat(2)]
