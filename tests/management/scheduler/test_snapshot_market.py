"""The snapshot's market inputs: a workload's rental terms become the job's (money in micro-units), a host's prices in
force become the host's, and renters without money are marked unfunded. With none given, the grid is free."""

from __future__ import annotations

import msgspec

from common.storage import CheckpointSpec
from management.market.prices import HostPrice
from management.scheduler.model import Host, Job, Policy
from management.scheduler.snapshot import build_snapshot, job_of
from master.records import AgentRecord, RentalTerms, ReplicaSpec, WorkloadRecord, WorkloadSpec


def workload(wid: str, account: str = "alice", rental: RentalTerms | None = None) -> WorkloadRecord:
    spec = WorkloadSpec(name=wid, image="busybox", replica=ReplicaSpec(gpus=1), rental=rental)
    return WorkloadRecord(id=wid, account=account, spec=spec, state="queued", created_at=1.0, queued_at=1.0)


def test_a_workload_without_rental_terms_is_an_unpriced_on_demand_job():
    job = job_of(workload("wl-0"))
    assert (job.rental, job.bid, job.max_price, job.pin, job.funded, job.reserved_s) == ("on_demand", 0, None, None, True, None)


def test_rental_terms_become_the_jobs_in_micro_units():
    spot = job_of(workload("wl-1", rental=RentalTerms(kind="interruptible", bid="0.35", offer="agt-7")))
    assert (spot.rental, spot.bid, spot.pin) == ("interruptible", 350_000, "agt-7")
    capped = job_of(workload("wl-2", rental=RentalTerms(kind="on_demand", max_price="2.5")))
    assert (capped.rental, capped.max_price) == ("on_demand", 2_500_000)
    reserved = job_of(workload("wl-3", rental=RentalTerms(kind="reserved", reserved_s=86_400.0, max_price="1")))
    assert (reserved.rental, reserved.reserved_s, reserved.max_price) == ("reserved", 86_400.0, 1_000_000)
    assert job_of(workload("wl-4"), funded=False).funded is False


def test_a_checkpointed_bid_whose_rented_host_was_lost_may_resume_on_any_host_its_bid_meets():
    terms = RentalTerms(kind="interruptible", bid="0.5", offer="agt-7")
    spec = WorkloadSpec(
        name="spot", image="none", replica=ReplicaSpec(gpus=1), rental=terms, checkpoint=CheckpointSpec(uri="s3://b/ck/")
    )
    lost = "agt-7: host agt-7 went offline"
    rec = WorkloadRecord(id="wl-5", account="a", spec=spec, state="queued", created_at=1.0, queued_at=1.0, host_failure=lost)
    assert job_of(rec).pin is None
    assert job_of(msgspec.structs.replace(rec, host_failure="")).pin == "agt-7"  # placed, preempted: its own host
    other = msgspec.structs.replace(rec, host_failure="agt-9: host agt-9 went offline")
    assert job_of(other).pin == "agt-7"
    no_checkpoint = msgspec.structs.replace(rec, spec=msgspec.structs.replace(spec, checkpoint=None))
    assert job_of(no_checkpoint).pin == "agt-7"  # nothing to resume from: it waits for its host
    on_demand = msgspec.structs.replace(spec, rental=RentalTerms(kind="on_demand", offer="agt-7"))
    assert job_of(msgspec.structs.replace(rec, spec=on_demand)).pin == "agt-7"  # its price was that host's


def agents() -> dict[str, AgentRecord]:
    return {
        "agt-priced": AgentRecord(id="agt-priced", provider="prov", state="ready"),
        "agt-default": AgentRecord(id="agt-default", provider="other", state="ready"),
    }


def snap(**kw: object):
    return build_snapshot(
        now=10.0,
        agents=agents(),
        gpus_by_agent={},
        holds={},
        workloads=[workload("wl-a", "alice"), workload("wl-b", "bob")],
        usage={},
        project_usage={},
        policy=Policy(),
        offline_grace_s=20.0,
        **kw,  # type: ignore[arg-type]
    )


def test_without_prices_every_host_is_free_and_every_renter_funded():
    s = snap()
    assert all((h.price, h.min_bid, h.reserved_price, h.max_duration_s) == (0, 0, 0, None) for h in s.hosts.values())
    assert all(j.funded for j in s.queue)


def test_prices_in_force_and_funds_are_read_per_host_and_per_renter():
    asked: list[tuple[str, str]] = []
    own = HostPrice(on_demand=2_000_000, min_bid=500_000, reserved_discount=0.25, max_duration_s=3600.0, source="host")
    grid = HostPrice(on_demand=1_000_000, min_bid=None)

    def prices(provider: str, agent_id: str) -> HostPrice:
        asked.append((provider, agent_id))
        return own if agent_id == "agt-priced" else grid

    for funded in ({"bob"}, lambda account: account == "bob"):
        asked.clear()
        s = snap(prices=prices, funded=funded)
        assert sorted(asked) == [("other", "agt-default"), ("prov", "agt-priced")]
        priced: Host = s.hosts["agt-priced"]
        terms = (priced.price, priced.min_bid, priced.reserved_price, priced.max_duration_s)
        assert terms == (2_000_000, 500_000, 1_500_000, 3600.0)
        default: Host = s.hosts["agt-default"]
        assert (default.price, default.min_bid) == (1_000_000, None)
        by_account: dict[str, Job] = {j.account: j for j in s.queue}
        assert (by_account["alice"].funded, by_account["bob"].funded) == (False, True)


def test_a_host_under_review_for_its_completion_rate_takes_no_new_work():
    """docs/disputes.md, "Completion rates": until an operator reviews it, the scheduler places nothing new there."""
    s = snap(under_review=lambda agent_id: agent_id == "agt-priced")
    assert (s.hosts["agt-priced"].takes_work, s.hosts["agt-default"].takes_work) == (False, True)
    assert all(h.takes_work for h in snap().hosts.values())
