"""Reputation: a score in [0, 1] from six components, each moved by its own evidence and shown with it."""

from __future__ import annotations

import msgspec
import pytest

from common.containers import ContainerSpec
from common.errors import InvalidRating
from common.wire import BenchmarkFigures, CommandResult
from master.records import AgentRecord, GpuVerification
from master.reputation import COMPONENTS, WEIGHTS, reputation, reputation_score
from tests.master.linked import connect, events, gpus, relay, relay_link


def agent(**counters: float) -> AgentRecord:
    return AgentRecord(id="agt-1", provider="p", state="ready", **counters)  # type: ignore[arg-type]


def test_a_new_agent_starts_in_the_middle_of_every_component_that_needs_evidence():
    rep = reputation(agent())
    assert set(rep.components) == set(COMPONENTS)
    assert all(value == 0.5 for value in rep.components.values())
    assert rep.score == 0.5


def test_the_weights_sum_to_one_and_the_score_is_their_weighted_sum():
    assert abs(sum(WEIGHTS.values()) - 1.0) < 1e-9
    rep = reputation(agent(uptime_s=1000, downtime_s=100, commands_succeeded=3, commands_failed=1, rentals_failed=2))
    assert abs(rep.score - sum(rep.weights[k] * v for k, v in rep.components.items())) < 1e-3


@pytest.mark.parametrize(
    ("component", "good", "bad", "evidence"),
    [
        ("uptime", {"uptime_s": 86400}, {"uptime_s": 3600, "downtime_s": 20000}, "downtime_s"),
        ("command_success", {"commands_succeeded": 50}, {"commands_failed": 20}, "commands_failed"),
        ("container_success", {"containers_started": 30}, {"containers_failed": 10}, "containers_failed"),
        ("rentals", {"rentals_completed": 40}, {"rentals_failed": 8}, "rentals_failed"),
        ("verification", {"gpus_verified": 8}, {"gpus_flagged": 6, "gpus_verified": 2}, "gpus_flagged"),
        ("ratings", {"ratings_count": 20, "ratings_sum": 100}, {"ratings_count": 20, "ratings_sum": 20}, "ratings_count"),
    ],
)
def test_each_component_moves_with_its_own_evidence_and_shows_it(component, good, bad, evidence):
    neutral = reputation(agent())
    better, worse = reputation(agent(**good)), reputation(agent(**bad))
    assert better.components[component] > neutral.components[component] > worse.components[component]
    assert better.score > neutral.score > worse.score
    others = [name for name in COMPONENTS if name != component]
    assert [worse.components[n] for n in others] == [neutral.components[n] for n in others]
    assert worse.evidence[evidence] == bad[evidence]


def test_verification_is_full_only_when_every_gpu_is_tiered_without_a_flag():
    assert reputation(agent(gpus_verified=8)).components["verification"] == 1.0
    assert reputation(agent(gpus_verified=4, gpus_unverified=4)).components["verification"] == 0.75
    assert reputation(agent(gpus_verified=4, gpus_flagged=4)).components["verification"] == 0.5
    assert reputation(agent(gpus_flagged=2)).components["verification"] == 0.0


def test_one_rating_does_not_swing_the_ratings_component():
    one_bad = reputation(agent(ratings_count=1, ratings_sum=1)).components["ratings"]
    one_good = reputation(agent(ratings_count=1, ratings_sum=5)).components["ratings"]
    assert (one_bad, one_good) == (0.4, 0.6)
    many_good = reputation(agent(ratings_count=50, ratings_sum=250)).components["ratings"]
    assert many_good > 0.95


def test_an_agent_record_stored_before_the_new_counters_still_decodes_with_them_at_zero():
    old = msgspec.json.encode(
        {"id": "agt-old", "provider": "p", "state": "ready", "uptime_s": 500.0, "commands_succeeded": 4, "version": 3}
    )
    record = msgspec.json.decode(old, type=AgentRecord)
    assert (record.rentals_failed, record.ratings_count, record.gpus_verified, record.containers_started) == (0, 0, 0, 0)
    assert reputation(record).evidence["commands_succeeded"] == 4


def test_the_score_alone_is_the_score_of_the_whole_reputation():
    # How fast scoring 10,000 hosts is, is bench's (`python -m bench summaries`, target in bench/README.md).
    hosts = [agent(uptime_s=float(i), commands_succeeded=i % 7, rentals_failed=i % 3, gpus_verified=8) for i in range(50)]
    assert [reputation_score(h) for h in hosts] == [reputation(h).score for h in hosts]


# --- on the real Master -------------------------------------------------------------------------------------------


async def test_a_rental_failed_through_the_host_lowers_its_score_and_an_event_says_why(master):
    await connect(master, relay_link(), "agt-a")
    before = reputation(master.agent("agt-a"))
    after = await master.record_rental_outcome("agt-a", failed=True, reason="rental wl-1-a1: host went offline", now=100.0)
    assert after.score < before.score
    assert after.evidence["rentals_failed"] == 1
    stored = await master.store.agents.get("agt-a")
    assert stored is not None and stored.rentals_failed == 1
    [event] = await events(master, "agent.reputation", "agt-a")
    assert event.data["component"] == "rentals"
    assert (event.data["old"], event.data["new"]) == (before.score, after.score)
    assert event.data["reason"] == "rental wl-1-a1: host went offline"


async def test_a_rental_that_ended_well_raises_the_rentals_component(master):
    await connect(master, relay_link(), "agt-a")
    after = await master.record_rental_outcome("agt-a", failed=False, reason="rental wl-2-a1 ended: cancelled", now=1.0)
    assert after.components["rentals"] > 0.5
    assert master.agent("agt-a").rentals_completed == 1


async def test_a_rating_is_counted_and_recorded_and_one_outside_1_to_5_is_refused(master):
    await connect(master, relay_link(), "agt-a")
    after = await master.record_rating("agt-a", 5, "wl-3-a1", now=2.0)
    assert after.components["ratings"] == 0.6
    [event] = await events(master, "agent.reputation", "agt-a")
    assert event.data["component"] == "ratings" and "wl-3-a1" in event.data["reason"]
    for bad in (0, 6, True):
        with pytest.raises(InvalidRating, match="rating"):
            await master.record_rating("agt-a", bad, "wl-3-a1", now=2.0)


async def test_container_creates_that_fail_on_the_host_lower_container_success(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    ok = await master.create_command("agt-a", ContainerSpec(name="c1", image="none", gpus=["0"]))
    await relay(master, link, "agt-a", CommandResult(id=ok.id, ok=True))
    bad = await master.create_command("agt-a", ContainerSpec(name="c2", image="none", gpus=["1"]))
    await relay(master, link, "agt-a", CommandResult(id=bad.id, ok=False, error="image pull failed"))
    agent_now = master.agent("agt-a")
    assert (agent_now.containers_started, agent_now.containers_failed) == (1, 1)
    assert reputation(agent_now).components["container_success"] == 0.5


def passed(at: float = 1.0) -> GpuVerification:
    """A passed challenge on a real card, as master/verification.py records it (no GPU here: the record stands in)."""
    return GpuVerification(status="verified", at=at, figures=BenchmarkFigures(bf16_tflops=800.0, memory_bandwidth_gbs=3000.0))


def real(infos: list) -> list:
    """GPU reports of real cards (a simulated GPU is never verified by measurement)."""
    return [msgspec.structs.replace(info, simulated=False) for info in infos]


async def test_verification_counts_measured_verification_not_agreement_with_the_catalog(master):
    await connect(master, relay_link(), "agt-a", real(gpus(2)))  # two H100s the catalog knows: tiered, not measured
    assert reputation(master.agent("agt-a")).components["verification"] == 0.5
    for gpu in master.gpus("agt-a"):
        await master.registry.set_verification(gpu.uuid, passed())
    assert reputation(master.agent("agt-a")).components["verification"] == 1.0
    unknown = gpus(1, prefix="GPU-odd", name="Mystery Accelerator 9000")
    await connect(master, relay_link(), "agt-b", real([*gpus(1, prefix="GPU-b"), *unknown]))
    await master.registry.set_verification("GPU-b-0", passed())
    agent_b = master.agent("agt-b")
    assert (agent_b.gpus_verified, agent_b.gpus_flagged) == (1, 1)
    assert reputation(agent_b).components["verification"] == 0.5


async def test_a_failed_challenge_flags_the_gpu_and_counts_nothing(master):
    await connect(master, relay_link(), "agt-a")
    uuid = master.gpus("agt-a")[0].uuid
    failed = GpuVerification(status="failed", code="late", reason="too slow", at=1.0)
    record = await master.registry.set_verification(uuid, failed)
    assert record is not None and record.tier is None and "verification_failed" in record.flags
    assert master.agent("agt-a").gpus_flagged == 1


async def test_an_agent_stored_without_verification_counts_gets_them_from_its_gpus_when_the_master_loads(tmp_path):
    from master.config import MasterConfig
    from master.master import Master

    config = MasterConfig(state_dir=str(tmp_path / "m"), link_port=0)
    first = Master(config)
    await first.start()
    await connect(first, relay_link(), "agt-a", real(gpus(2)))
    for gpu in first.gpus("agt-a"):
        await first.registry.set_verification(gpu.uuid, passed())
    stored = first.agent("agt-a")
    stored.gpus_verified = 0  # as a record written before the counters existed
    await first.registry.save(stored)
    await first.stop()
    again = Master(config)
    await again.start()
    try:
        assert again.agent("agt-a").gpus_verified == 2
        assert reputation(again.agent("agt-a")).components["verification"] == 1.0
    finally:
        await again.stop()
