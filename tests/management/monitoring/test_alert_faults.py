"""A fault-class alert feeds the scheduler (a real Master and scheduling loop, SQLite; the GPU is simulated by the
test's telemetry): a rented GPU that overheats fires the alert labelled with its renter and workload, is marked
faulty through the Master's fault path, and the workload is placed on another host."""

from __future__ import annotations

import time

import msgspec

from common.inventory import GpuSample
from common.wire import Telemetry
from management.monitoring.alert_loop import ALERT_FAULT, AlertLoop
from management.monitoring.evaluator import FIRING, RESOLVED
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import load_rules
from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from tests.management.workloads.test_runner import host, scheduler, spec, started
from tests.master.linked import relay, relay_link


async def test_an_overheating_rented_gpu_is_marked_faulty_and_its_workload_runs_elsewhere(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, max_temperature_c=200))
    await master.start()
    try:
        await master.accounts.ensure("alice", AccountRole.RENTER)
        link = relay_link()
        await host(master, link, "agt-a")
        await host(master, link, "agt-b")
        placing = scheduler(master)
        await placing.book.load()
        workload = await placing.book.submit("alice", spec(), time.time())
        await placing.cycle()
        await started(master, link, await placing.book.get(workload.id))
        await placing.cycle()
        (first,) = (await placing.book.get(workload.id)).assignments
        gpu_uuid = first.units[0]

        [shipped] = [r for r in load_rules() if r.name == "gpu_overheating"]
        rule = msgspec.structs.replace(shipped, for_s=0.0)  # at once: the duration is the evaluator's tests' matter
        now = [time.time()]
        alerts = AlertLoop(FleetObserver(master, placing.book.open_workloads), [rule], clock=lambda: now[0])
        alerts.observer.attach()
        hot = GpuSample(uuid=gpu_uuid, ts=now[0], temperature_c=95.0, utilization_pct=99.0)
        await relay(master, link, first.agent_id, Telemetry(ts=now[0], samples=[hot]))
        [fired] = await alerts.step()
        assert (fired.rule, fired.subject, fired.phase) == ("gpu_overheating", gpu_uuid, FIRING)
        assert (fired.labels["renter"], fired.labels["workload"]) == ("alice", workload.id)
        gpu = master.registry.gpus[gpu_uuid]
        assert gpu.state == "faulty" and gpu.fault is not None and gpu.fault.kind == ALERT_FAULT

        await placing.cycle()  # requeued off the faulty GPU
        await placing.cycle()  # placed elsewhere
        record = await placing.book.get(workload.id)
        (second,) = record.assignments
        assert record.state == "scheduled" and second.agent_id != first.agent_id

        now[0] += 10
        cool = GpuSample(uuid=gpu_uuid, ts=now[0], temperature_c=60.0)
        await relay(master, link, first.agent_id, Telemetry(ts=now[0], samples=[cool]))
        assert await alerts.step() == []  # cool, but not yet for the rule's clear_for_s
        now[0] += rule.clear_for_s
        resolved = await alerts.step()
        assert [(t.rule, t.phase) for t in resolved] == [("gpu_overheating", RESOLVED)]
        assert gpu.fault is None and gpu.state != "faulty"  # the alert's fault, and only it, is cleared
    finally:
        await master.stop()


async def report(master: Master, link: AccessLink, gpu_uuid: str, ts: float, temperature: float) -> None:
    """agt-a's telemetry: one sample of ``gpu_uuid``, through the Master's link handler."""
    sample = GpuSample(uuid=gpu_uuid, ts=ts, temperature_c=temperature)
    await relay(master, link, "agt-a", Telemetry(ts=ts, samples=[sample]))


async def test_after_a_master_restart_an_alerts_fault_is_adopted_and_cleared_when_the_gpu_has_cooled(tmp_path):
    [shipped] = [r for r in load_rules() if r.name == "gpu_overheating"]
    rule = msgspec.structs.replace(shipped, for_s=0.0)
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, max_temperature_c=200)
    now = [time.time()]
    master = Master(config)
    await master.start()
    try:
        link = relay_link()
        [gpu_uuid] = await host(master, link, "agt-a")
        alerts = AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0])
        alerts.observer.attach()
        await relay(
            master, link, "agt-a", Telemetry(ts=now[0], samples=[GpuSample(uuid=gpu_uuid, ts=now[0], temperature_c=95.0)])
        )
        [fired] = await alerts.step()
        fault = master.registry.gpus[gpu_uuid].fault
        assert fault is not None and fault.kind == ALERT_FAULT
    finally:
        await master.stop()

    master = Master(config)  # the alert's state is gone; the fault is stored
    await master.start()
    try:
        link = relay_link()
        await host(master, link, "agt-a")
        gpu = master.registry.gpus[gpu_uuid]
        assert gpu.state == "faulty" and gpu.fault is not None and gpu.fault.kind == ALERT_FAULT
        alerts = AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0])
        alerts.observer.attach()
        now[0] += 5
        await relay(
            master, link, "agt-a", Telemetry(ts=now[0], samples=[GpuSample(uuid=gpu_uuid, ts=now[0], temperature_c=60.0)])
        )
        assert await alerts.step() == []  # adopted as firing: not fired again
        assert [(s.rule, s.subject) for s in alerts.firing()] == [("gpu_overheating", gpu_uuid)]
        now[0] += rule.clear_for_s
        [resolved] = await alerts.step()
        assert (resolved.phase, resolved.fired_at) == (RESOLVED, fired.at)
        assert gpu.fault is None and gpu.state == "available"
    finally:
        await master.stop()
