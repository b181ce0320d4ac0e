"""The fair-share meter (management/scheduler/usage.py), pure: charging, decay, and the round trip through the records
the store keeps (``snapshot_for_store`` then ``restore``), decayed across the time between."""

from __future__ import annotations

import pytest

from management.scheduler.model import Job
from management.scheduler.usage import UsageMeter
from master.records import FairShareUsage

HALF_LIFE_S = 1000.0
T0 = 1_700_000_000.0


def running(job_id: str, account: str, project: str, gpus: int) -> Job:
    return Job(id=job_id, account=account, project=project, started_at=T0, assignment=((tuple(f"GPU-{i}" for i in range(gpus))),))


def meter_that_charged() -> UsageMeter:
    """alice ran 2 GPUs (project nlp) and bob 1 GPU (project vision) for 100 s, from T0."""
    meter = UsageMeter(HALF_LIFE_S)
    jobs = [running("wl-a", "alice", "nlp", 2), running("wl-b", "bob", "vision", 1)]
    meter.advance(T0, jobs)  # starts the clock
    meter.advance(T0 + 100, jobs)
    return meter


def test_a_meter_charges_gpu_seconds_per_account_and_project() -> None:
    meter = meter_that_charged()
    assert meter.usage == {"alice": 200.0, "bob": 100.0}
    assert meter.project_usage == {("alice", "nlp"): 200.0, ("bob", "vision"): 100.0}


def test_a_meter_is_saved_as_one_record_per_account_and_per_project_decayed_to_its_clock() -> None:
    saved = meter_that_charged().snapshot_for_store()
    at = T0 + 100
    assert saved == [
        FairShareUsage(account="alice", gpu_seconds=200.0, decayed_to=at),
        FairShareUsage(account="bob", gpu_seconds=100.0, decayed_to=at),
        FairShareUsage(account="alice", project="nlp", gpu_seconds=200.0, decayed_to=at),
        FairShareUsage(account="bob", project="vision", gpu_seconds=100.0, decayed_to=at),
    ]


def test_a_meter_that_never_started_saves_nothing() -> None:
    assert UsageMeter(HALF_LIFE_S).snapshot_for_store() == []


def test_a_restored_meter_has_the_saved_usage_decayed_across_the_gap() -> None:
    saved = meter_that_charged().snapshot_for_store()
    restarted = UsageMeter(HALF_LIFE_S)

    restarted.restore(saved, T0 + 100 + 2 * HALF_LIFE_S)  # down for two half-lives

    assert restarted.usage == pytest.approx({"alice": 50.0, "bob": 25.0})
    assert restarted.project_usage == pytest.approx({("alice", "nlp"): 50.0, ("bob", "vision"): 25.0})


def test_a_restored_meter_charges_only_from_its_restore_on_not_the_downtime() -> None:
    saved = meter_that_charged().snapshot_for_store()
    restarted = UsageMeter(HALF_LIFE_S)
    back = T0 + 100 + HALF_LIFE_S
    restarted.restore(saved, back)

    job = running("wl-a", "alice", "nlp", 2)
    restarted.advance(back, [job])  # the first cycle after the restore: the clock runs already, nothing to charge
    assert restarted.usage["alice"] == pytest.approx(100.0)
    restarted.advance(back + 10, [job])
    assert restarted.usage["alice"] == pytest.approx(100.0 * 0.5 ** (10 / HALF_LIFE_S) + 20.0)
    assert restarted.snapshot_for_store()[0].decayed_to == back + 10


def test_restoring_adds_to_what_the_meter_charged_meanwhile_at_the_meters_own_clock() -> None:
    """A load that failed at start and succeeded later: both figures count, the saved one decayed to the meter's clock."""
    meter = UsageMeter(HALF_LIFE_S)
    job = running("wl-a", "alice", "nlp", 1)
    meter.advance(T0, [job])
    meter.advance(T0 + 50, [job])
    saved = [FairShareUsage(account="alice", gpu_seconds=80.0, decayed_to=T0 + 50 - HALF_LIFE_S)]

    meter.restore(saved, T0 + 999)  # the meter's clock (T0 + 50) decides, not the time given

    assert meter.usage == pytest.approx({"alice": 50.0 + 40.0})
    assert meter.project_usage == {("alice", "nlp"): 50.0}


def test_a_figure_saved_ahead_of_the_clock_is_taken_as_it_is() -> None:
    meter = UsageMeter(HALF_LIFE_S)
    meter.restore([FairShareUsage(account="alice", project="nlp", gpu_seconds=30.0, decayed_to=T0 + 60)], T0)
    assert meter.project_usage == {("alice", "nlp"): 30.0} and meter.usage == {}
