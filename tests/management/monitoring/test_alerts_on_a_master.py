"""Alerts end to end on a real Master (SQLite in tmp_path): a simulated GPU's telemetry arrives through the Master's
relay-link handler as a relay forwards it (the GPU itself is what cannot exist here: the test's samples stand in for
NVML), the alert loop runs on its period, a real aiohttp receiver takes the signed webhooks.

Acceptance: an overheating GPU fires within the rule's duration plus one evaluation period, the webhook gets it
once, the GPU is marked faulty through the Master's fault path, a value flapping within the hysteresis fires nothing
more, and cooling resolves the alert (once) and clears the fault. An Xid fires the hardware error alert."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.inventory import GpuSample
from common.wire import AgentEvent, AgentEventKind, Telemetry
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.evaluator import FIRING, RESOLVED
from management.monitoring.notifier import SIGNATURE_HEADER, NotifierSettings, Webhook, WebhookNotifier
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import AlertRule, load_rules
from master.config import MasterConfig
from master.master import Master
from master.records import SilenceRecord
from tests.management.monitoring.receiver import WebhookReceiver
from tests.master.linked import connect, events, relay, relay_link

GPU0 = "GPU-h100-0"
PERIOD_S = 0.2
# The shipped rule's shape (85 °C, clear at 80), with a duration a test can wait for.
OVERHEATING = AlertRule(
    name="gpu_overheating",
    metric="gpu.temperature_c",
    op=">",
    threshold=85,
    for_s=0.6,
    clear_threshold=80,
    severity="critical",
    scope="gpu",
    fault=True,
    summary="GPU over 85 °C",
)
SECRET = "hook-secret"
# What an evaluation may add to the bound beyond PERIOD_S on a loaded test machine: the step itself, sleep overshoot.
SLACK_S = 0.1


@dataclass
class SimulatedGpu:
    """Sends GPU0's temperature every 50 ms through the Master's link handler, as an agent behind a relay would."""

    master: Master
    temperature: float = 60.0
    changed_at: dict[float, float] = field(default_factory=dict)  # temperature -> ts of its first sample
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        link = relay_link()
        await connect(self.master, link, "agt-a")
        while True:
            ts = time.time()
            self.changed_at.setdefault(self.temperature, ts)
            sample = GpuSample(uuid=GPU0, ts=ts, temperature_c=self.temperature, utilization_pct=50.0)
            await relay(self.master, link, "agt-a", Telemetry(ts=ts, samples=[sample]))
            await asyncio.sleep(0.05)


@dataclass
class Grid:
    master: Master
    loop: AlertLoop
    receiver: WebhookReceiver
    gpu: SimulatedGpu

    async def evaluations(self, count: int) -> None:
        await asyncio.sleep(PERIOD_S * count + SLACK_S)  # a span of time is what is tested here: nothing to wait on


@pytest.fixture
async def grid(tmp_path: Path) -> AsyncIterator[Grid]:
    # The Master's own overheat fault (3 samples at max_temperature_c) is set out of the way: the alert's is tested.
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, max_temperature_c=200))
    await master.start()
    receiver = WebhookReceiver()
    await receiver.start()
    # The receiver is on 127.0.0.1, which the operator's webhooks reach only with allow_private (webhook_allow_private).
    notifier = WebhookNotifier(settings=NotifierSettings(backoff_s=0.01, backoff_max_s=0.05, timeout_s=2.0, allow_private=True))
    notifier.webhooks["ops"] = Webhook(id="wh-ops", url=receiver.url, secret=SECRET, owner="operator", role="operator")
    loop = AlertLoop(FleetObserver(master), [OVERHEATING], notifier=notifier, period_s=PERIOD_S)
    loop.start()
    gpu = SimulatedGpu(master)
    gpu.start()
    try:
        yield Grid(master, loop, receiver, gpu)
    finally:
        await gpu.stop()
        await loop.stop()
        await receiver.stop()
        await master.stop()


async def test_an_overheating_gpu_fires_once_is_marked_faulty_rides_out_flapping_and_resolves_when_it_cools(grid):
    await grid.evaluations(2)  # cool and watched
    assert grid.receiver.requests == [] and grid.loop.firing() == []

    grid.gpu.temperature = 88.0
    [fired] = await grid.receiver.wait_for(1)
    hot_since = grid.gpu.changed_at[88.0]
    alert = fired.payload["alert"]
    assert (alert["rule"], alert["subject"], alert["phase"], alert["since"]) == ("gpu_overheating", GPU0, FIRING, hot_since)
    assert OVERHEATING.for_s <= alert["at"] - hot_since <= OVERHEATING.for_s + PERIOD_S + SLACK_S
    expected = "sha256=" + hmac.new(SECRET.encode(), fired.body, hashlib.sha256).hexdigest()
    assert fired.headers[SIGNATURE_HEADER] == expected
    assert fired.payload["idempotency_key"] == alert["key"]
    assert alert["labels"]["provider"] == "prov" and alert["labels"]["agent_id"] == "agt-a"
    gpu = grid.master.registry.gpus[GPU0]
    assert gpu.state == "faulty" and gpu.fault is not None and gpu.fault.kind == "alert"
    [recorded] = await events(grid.master, "alert.firing", GPU0)
    assert recorded.data["key"] == alert["key"]

    for temperature in (82.0, 89.0, 81.0, 87.0, 83.0, 90.0, 84.0):  # under 85 and over it, never under 80
        grid.gpu.temperature = temperature
        await asyncio.sleep(PERIOD_S)
    await grid.evaluations(2)
    assert len(grid.receiver.requests) == 1 and [s.phase for s in grid.loop.firing()] == [FIRING]

    grid.gpu.temperature = 70.0
    requests = await grid.receiver.wait_for(2)
    resolved = requests[1].payload["alert"]
    assert (resolved["phase"], resolved["fired_at"], resolved["subject"]) == (RESOLVED, alert["fired_at"], GPU0)
    assert resolved["key"] != alert["key"]
    assert gpu.state == "available" and gpu.fault is None
    await grid.evaluations(3)
    assert len(grid.receiver.requests) == 2  # delivered once per transition
    assert len(await events(grid.master, "alert.resolved", GPU0)) == 1


async def test_a_value_flapping_around_the_threshold_faster_than_the_duration_never_fires(grid):
    for _ in range(5):  # each hot spell is shorter than for_s
        grid.gpu.temperature = 87.0
        await asyncio.sleep(OVERHEATING.for_s / 3)
        grid.gpu.temperature = 79.0
        await asyncio.sleep(PERIOD_S)
    await grid.evaluations(2)
    assert grid.receiver.requests == [] and grid.loop.firing() == []
    assert grid.master.registry.gpus[GPU0].state == "available"


async def test_an_xid_on_a_gpu_fires_the_shipped_hardware_error_alert(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a")
        [hardware] = [r for r in load_rules() if r.name == "gpu_hardware_error"]
        loop = AlertLoop(FleetObserver(master), [hardware])
        assert await loop.step() == []
        xid = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=GPU0, code=79, message="fell off the bus")
        await relay(master, link, "agt-a", xid)
        [transition] = await loop.step()
        assert (transition.rule, transition.subject, transition.phase) == ("gpu_hardware_error", GPU0, FIRING)
        fault = master.registry.gpus[GPU0].fault
        assert fault is not None and fault.kind == "xid"  # the Master's own fault path, unchanged
        await master.repair_gpu(GPU0)
        [cleared] = await loop.step()
        assert cleared.phase == RESOLVED
    finally:
        await master.stop()


async def test_a_silenced_alert_is_recorded_but_not_delivered_and_delivered_again_once_the_silence_expires(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    receiver = WebhookReceiver()
    await receiver.start()
    now = [time.time()]
    rules = [r for r in load_rules() if r.name == "gpu_hardware_error"]
    notifier = WebhookNotifier(settings=NotifierSettings(allow_private=True))  # the receiver is on 127.0.0.1
    loop = AlertLoop(FleetObserver(master), rules, notifier=notifier, clock=lambda: now[0])
    loop.notifier.webhooks["ops"] = Webhook(id="wh-ops", url=receiver.url, secret=SECRET, owner="operator", role="operator")
    loop.notifier.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a")
        loop.silences.put(
            SilenceRecord(id="sil-1", expires_at=now[0] + 60, created_at=now[0], created_by="operator", subject=GPU0)
        )
        await relay(master, link, "agt-a", AgentEvent(kind=AgentEventKind.GPU_XID, ts=now[0], gpu_uuid=GPU0, code=79))
        [fired] = await loop.step()
        assert len(await events(master, "alert.firing", GPU0)) == 1
        now[0] += 61  # the silence is over
        await master.repair_gpu(GPU0)
        [resolved] = await loop.step()
        [delivered] = await receiver.wait_for(1)
        assert delivered.payload["idempotency_key"] == resolved.key != fired.key
    finally:
        await loop.stop()
        await receiver.stop()
        await master.stop()
