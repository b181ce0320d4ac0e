"""What the observer reads off a real Master (SQLite): the command failure rate over its window from the hosts'
counters, renters' balance cover, offline hosts; and the shipped rules fire on them."""

from __future__ import annotations

import time

from management.monitoring.alert_loop import AlertLoop
from management.monitoring.evaluator import FIRING, RESOLVED
from management.monitoring.observe import COMMAND_WINDOW_S, FLEET_COMMAND_FAILURE, RENTER_BALANCE_COVER, FleetObserver
from management.monitoring.rules import load_rules
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import connect, relay_link


def shipped(name: str):
    [rule] = [r for r in load_rules() if r.name == name]
    return rule


async def test_the_command_failure_rate_counts_the_window_only_and_needs_enough_commands(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        await connect(master, relay_link(), "agt-a")
        agent = master.registry.agents["agt-a"]
        agent.commands_succeeded, agent.commands_failed = 100, 50  # before the window: not counted
        observer = FleetObserver(master)
        rule = shipped("command_failures")
        now = time.time()

        def rate(at: float) -> float:
            [series] = [s for s in observer.collect([rule], at) if s.metric == FLEET_COMMAND_FAILURE]
            return series.points[-1][1]

        assert rate(now) == 0.0
        agent.commands_failed += 1  # 1 of 1: too few to judge
        assert rate(now + 60) == 0.0
        agent.commands_succeeded += 8
        agent.commands_failed += 1  # 2 failed of 10 in the window
        assert rate(now + 120) == 20.0
        agent.commands_succeeded += 10
        assert rate(now + 120 + COMMAND_WINDOW_S) == 0.0  # the failures left the window; 10 succeeded in it
    finally:
        await master.stop()


async def test_a_renter_whose_balance_covers_under_an_hour_is_alerted_and_sees_it_as_its_own(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        cover = {"alice": 5000.0, "bob": 1200.0}
        observer = FleetObserver(master, balance_cover=lambda now: cover)  # the market's meter, as its figures
        loop = AlertLoop(observer, [shipped("renter_balance_low")])
        [fired] = await loop.step()
        assert (fired.rule, fired.subject, fired.phase, fired.labels) == ("renter_balance_low", "bob", FIRING, {"renter": "bob"})
        cover["bob"] = 4000.0  # over the threshold, under the clear threshold: still firing
        assert await loop.step() == []
        cover["bob"] = 9000.0
        [resolved] = await loop.step()
        assert resolved.phase == RESOLVED and RENTER_BALANCE_COVER == "renter.balance_cover_s"
    finally:
        await master.stop()


async def test_a_host_offline_for_the_rules_duration_fires(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        await connect(master, relay_link(), "agt-a")
        now = [time.time()]
        loop = AlertLoop(FleetObserver(master), [shipped("host_offline")], clock=lambda: now[0])
        master.registry.agents["agt-a"].state = "offline"  # as the sweep sets it after missed heartbeats
        assert await loop.step() == []
        now[0] += 299
        assert await loop.step() == []
        now[0] += 1
        [fired] = await loop.step()
        assert (fired.subject, fired.phase, fired.labels["provider"]) == ("agt-a", FIRING, "prov")
    finally:
        await master.stop()
