"""Prices and bids as inputs of the scheduler core: the price filter, cheapest first, the market's queue order and
preemption (docs/scheduler.md, "Prices and bids"). Snapshot in, decisions out; nothing mocked."""

from __future__ import annotations

from typing import Any

from management.market.money import parse_amount
from management.scheduler import FreePool, Host, Job, ReplicaRequest, explain, schedule
from management.scheduler.model import Plan
from tests.management.scheduler.grid import gpus, grid, host_of, placed, running, snapshot


def money(text: str) -> int:
    return parse_amount(text)


def job(jid: str, n: int = 1, *, prio: str = "normal", t: float = 0.0, **kw: object) -> Job:
    return Job(jid, kw.pop("account", "acme"), priority=prio, submitted_at=t, request=ReplicaRequest(gpus=n), **kw)  # type: ignore[arg-type]


def priced(spec: dict[str, tuple[int, dict[str, object]]]) -> tuple[dict[str, Host], dict]:
    """Hosts name -> (GPUs, Host price fields)."""
    hosts = [Host(h, **fields) for h, (_, fields) in spec.items()]  # type: ignore[arg-type]
    return grid(hosts, units=[u for h, (n, _) in spec.items() for u in gpus(h, n)])


def preempted(plan: Plan) -> dict[str, str]:
    return {p.job_id: p.for_job for p in plan.preempts()}


# --- the price filter -----------------------------------------------------------------------------------


def test_max_price_takes_only_hosts_at_or_under_it_and_the_explanation_says_which_and_why():
    hosts, units = priced({"dear1": (4, {"price": money("3")}), "dear2": (4, {"price": money("2.5")})})
    q = [job("capped", max_price=money("2"))]
    snap = snapshot(hosts, units, queue=q)
    assert placed(schedule(snap)) == {}
    e = explain(snap, "capped")
    price = next(f for f in e.filters if f.name == "price")
    assert (price.removed, price.remaining) == (8, 0)
    assert price.detail == "2 hosts list more than your max_price 2.00"
    assert "price: 2 hosts list more than your max_price 2.00" in e.summary
    # a host at exactly the cap is taken
    hosts, units = priced({"dear": (4, {"price": money("3")}), "fair": (4, {"price": money("2")})})
    assert host_of(units, placed(schedule(snapshot(hosts, units, queue=q)))["capped"][0]) == {"fair"}


def test_a_reserved_rental_is_capped_by_the_reserved_price_and_its_period_must_fit_the_hosts_max_duration():
    hosts, units = priced(
        {
            "short": (2, {"price": money("4"), "reserved_price": money("1"), "max_duration_s": 3600.0}),
            "long": (2, {"price": money("4"), "reserved_price": money("3")}),
        }
    )
    week = job("week", rental="reserved", reserved_s=7 * 86400.0, max_price=money("1.5"))
    snap = snapshot(hosts, units, queue=[week])
    assert placed(schedule(snap)) == {}  # short is cheap enough but too short; long lists 3.00 reserved
    detail = next(f for f in explain(snap, "week").filters if f.name == "price").detail
    assert "1 host list a reserved price of more than your max_price 1.50" in detail
    assert "1 host take rentals only up to a max duration shorter than yours" in detail
    hour = job("hour", rental="reserved", reserved_s=3600.0, max_price=money("1.5"))
    assert host_of(units, placed(schedule(snapshot(hosts, units, queue=[hour])))["hour"][0]) == {"short"}


def test_a_host_with_a_max_duration_takes_only_jobs_that_set_one_within_it():
    hosts, units = priced({"limited": (2, {"max_duration_s": 3600.0})})
    assert placed(schedule(snapshot(hosts, units, queue=[job("endless")]))) == {}
    assert placed(schedule(snapshot(hosts, units, queue=[job("too-long", max_duration_s=7200.0)]))) == {}
    assert "ok" in placed(schedule(snapshot(hosts, units, queue=[job("ok", max_duration_s=3600.0)])))


def test_an_interruptible_bid_must_meet_the_hosts_min_bid_and_a_host_with_no_min_bid_is_not_rented_interruptible():
    hosts, units = priced(
        {
            "no-spot": (2, {"price": money("1"), "min_bid": None}),
            "spot": (2, {"price": money("3"), "min_bid": money("0.8")}),
        }
    )
    low = job("low-bid", rental="interruptible", bid=money("0.5"))
    snap = snapshot(hosts, units, queue=[low])
    assert placed(schedule(snap)) == {}
    detail = next(f for f in explain(snap, "low-bid").filters if f.name == "price").detail
    assert detail == "1 host ask a min bid above your bid 0.50; 1 host are not rented interruptible"
    ok = job("ok-bid", rental="interruptible", bid=money("0.8"))
    assert host_of(units, placed(schedule(snapshot(hosts, units, queue=[ok])))["ok-bid"][0]) == {"spot"}


def test_a_pinned_job_runs_on_its_offer_or_waits_for_it():
    hosts, units = priced({"cheap": (4, {"price": 0}), "chosen": (4, {"price": money("5")})})
    plan = schedule(snapshot(hosts, units, queue=[job("pinned", pin="chosen")]))
    assert host_of(units, placed(plan)["pinned"][0]) == {"chosen"}
    busy = running(job("other", 4), [[f"chosen-g{i}" for i in range(4)]])
    snap = snapshot(hosts, units, queue=[job("pinned", pin="chosen")], run=[busy])
    assert placed(schedule(snap)) == {}  # the cheap host is idle, but it is not the offer rented
    e = explain(snap, "pinned")
    assert next(f for f in e.filters if f.name == "price").detail == "1 host are not the offer you rent (chosen)"


def test_a_renter_with_no_money_takes_only_free_hosts():
    hosts, units = priced({"paid": (4, {"price": money("1")}), "free": (1, {"price": 0})})
    q = [job("broke-1", funded=False, t=1), job("broke-2", funded=False, t=2)]
    plan = schedule(snapshot(hosts, units, queue=q))
    assert list(placed(plan)) == ["broke-1"] and host_of(units, placed(plan)["broke-1"][0]) == {"free"}
    e = explain(snapshot(hosts, units, queue=q[1:], run=[running(q[0], placed(plan)["broke-1"])]), "broke-2")
    assert "not enough are idle now (price: 1 host charge money and your account has no available balance)" in e.summary
    # a funded renter takes the paid host
    assert "rich" in placed(schedule(snapshot(hosts, units, queue=[job("rich", 2)])))


def test_a_job_under_a_reached_hard_spend_cap_takes_only_free_hosts_and_its_wait_names_the_cap():
    hosts, units = priced({"paid": (4, {"price": money("1")}), "free": (1, {"price": 0})})
    cap = "the hard cap of 5.00 USD per hour on project train is reached (5.00 USD spent)"
    q = [job("capped-1", capped=cap, t=1), job("capped-2", capped=cap, t=2)]
    plan = schedule(snapshot(hosts, units, queue=q))
    assert list(placed(plan)) == ["capped-1"] and host_of(units, placed(plan)["capped-1"][0]) == {"free"}
    e = explain(snapshot(hosts, units, queue=q[1:], run=[running(q[0], placed(plan)["capped-1"])]), "capped-2")
    assert f"1 host charge money and {cap}: it waits until the cap allows it (or is raised)" in e.summary


# --- cheapest first -----------------------------------------------------------------------------------


def test_a_priced_job_takes_the_cheapest_hosts_that_fit_then_the_next_cheapest():
    hosts, units = priced(
        {"cheap": (8, {"price": money("1")}), "mid": (2, {"price": money("2")}), "dear": (4, {"price": money("3")})}
    )
    q = [job("a", 2, t=1), job("b", 4, t=2), job("c", 2, t=3), job("d", 4, t=4)]
    plan = schedule(snapshot(hosts, units, queue=q))
    where = {j: host_of(units, a[0]) for j, a in placed(plan).items()}
    # bin-packing alone would put a on mid and b on dear (the fullest hosts that fit); here the price leads,
    # and d takes dear, the only host left it fits on
    assert where == {"a": {"cheap"}, "b": {"cheap"}, "c": {"cheap"}, "d": {"dear"}}
    # a reserved rental compares reserved prices
    hosts, units = priced(
        {"od-cheap": (2, {"price": money("1"), "reserved_price": money("3")}), "res-cheap": (4, {"price": money("2")})}
    )
    plan = schedule(snapshot(hosts, units, queue=[job("r", 1, rental="reserved", reserved_s=3600.0), job("o", 1, t=1)]))
    assert {j: host_of(units, a[0]) for j, a in placed(plan).items()} == {"r": {"res-cheap"}, "o": {"od-cheap"}}


def test_among_equal_prices_the_placement_order_decides():
    hosts, units = priced(
        {"h1": (8, {"price": money("1")}), "h2": (2, {"price": money("1")}), "dear": (1, {"price": money("2")})}
    )
    plan = schedule(snapshot(hosts, units, queue=[job("j", 1)]))
    assert host_of(units, placed(plan)["j"][0]) == {"h2"}  # bin-packing among the cheapest: the fullest that fits
    plan = schedule(snapshot(hosts, units, queue=[job("s", 1, placement="spread")]))
    assert host_of(units, placed(plan)["s"][0]) == {"h1"}


def test_a_kept_pool_follows_a_hosts_new_price():
    hosts, units = priced({"a": (2, {"price": money("1")}), "b": (2, {"price": money("2")})})
    pool = FreePool(snapshot(hosts, units))
    first = placed(schedule(snapshot(hosts, units, queue=[job("x")]), pool=pool))["x"]
    assert host_of(units, first[0]) == {"a"}
    repriced = {**hosts, "a": Host("a", price=money("3"))}  # the next cycle's snapshot: a now costs more than b
    x = running(job("x"), first)
    plan = schedule(snapshot(repriced, units, queue=[job("y")], run=[x]), pool=pool)
    assert host_of(units, placed(plan)["y"][0]) == {"b"}
    # and the kept pool answers as one built from scratch
    fresh = schedule(snapshot(repriced, units, queue=[job("y")], run=[x]))
    assert placed(fresh) == placed(plan)


# --- queue order ------------------------------------------------------------------------------------


def test_on_demand_goes_before_interruptible_and_interruptibles_by_bid_but_class_first():
    hosts, units = grid({"h1": 1})
    q = [
        job("bid-1", rental="interruptible", bid=money("1"), t=0),
        job("bid-3", rental="interruptible", bid=money("3"), t=5),
        job("od", t=9),
    ]
    assert list(placed(schedule(snapshot(hosts, units, queue=q)))) == ["od"]
    assert list(placed(schedule(snapshot(hosts, units, queue=q[:2])))) == ["bid-3"]
    high_spot = job("high-spot", prio="high", rental="interruptible", bid=0, t=9)
    assert list(placed(schedule(snapshot(hosts, units, queue=[job("od", t=0), high_spot])))) == ["high-spot"]


# --- preemption -------------------------------------------------------------------------------------


def spot(jid: str, bid: str, unit: str, started: float = 0.0, **kw: Any) -> Job:  # kw: more of job()'s fields
    return running(job(jid, rental="interruptible", bid=money(bid), **kw), [[unit]], started_at=started)


def test_an_on_demand_rental_preempts_the_lowest_bid_first():
    hosts, units = grid({"h1": 1, "h2": 1, "h3": 1})
    run = [spot("bid-2", "2", "h1-g0", 10), spot("bid-1", "1", "h2-g0", 0), spot("bid-3", "3", "h3-g0", 20)]
    plan = schedule(snapshot(hosts, units, queue=[job("od")], run=run))
    assert preempted(plan) == {"bid-1": "od"}
    reason = plan.preempts()[0].reason
    assert reason == "preempted for od (on_demand) over its bid 1.00"
    # on one host too: the lowest bid goes, though the other started later
    hosts, units = grid({"h1": 2})
    run = [spot("bid-1", "1", "h1-g0", 0), spot("bid-2", "2", "h1-g1", 50)]
    assert preempted(schedule(snapshot(hosts, units, queue=[job("od")], run=run))) == {"bid-1": "od"}


def test_among_equal_lowest_bids_the_most_recently_started_is_preempted():
    hosts, units = grid({"h1": 1, "h2": 1})
    run = [spot("older", "1", "h1-g0", 0), spot("newer", "1", "h2-g0", 50)]
    assert preempted(schedule(snapshot(hosts, units, queue=[job("od")], run=run))) == {"newer": "od"}


def test_a_higher_bid_preempts_a_lower_one_and_equal_bids_do_not_preempt_each_other():
    hosts, units = grid({"h1": 1})
    run = [spot("low", "1", "h1-g0")]
    higher = job("higher", rental="interruptible", bid=money("1.000001"))
    assert preempted(schedule(snapshot(hosts, units, queue=[higher], run=run))) == {"low": "higher"}
    equal = job("equal", rental="interruptible", bid=money("1"))
    plan = schedule(snapshot(hosts, units, queue=[equal], run=run))
    assert preempted(plan) == {} and placed(plan) == {}
    lower = job("lower", rental="interruptible", bid=money("0.5"))
    assert preempted(schedule(snapshot(hosts, units, queue=[lower], run=run))) == {}


def test_reserved_rentals_are_never_preempted_not_even_by_a_class_that_may_preempt():
    hosts, units = grid({"h1": 1})
    reserved = running(job("res", prio="low", rental="reserved", reserved_s=7200.0), [["h1-g0"]])
    for q in (job("crit", prio="critical"), job("od"), job("spot", rental="interruptible", bid=money("9"))):
        plan = schedule(snapshot(hosts, units, queue=[q], run=[reserved]))
        assert preempted(plan) == {} and placed(plan) == {}


def test_interruptibles_never_preempt_on_demand_work():
    hosts, units = grid({"h1": 1})
    od = running(job("od"), [["h1-g0"]])
    plan = schedule(snapshot(hosts, units, queue=[job("rich-spot", rental="interruptible", bid=money("1000"))], run=[od]))
    assert preempted(plan) == {} and placed(plan) == {}


def test_a_lower_class_interruptible_is_a_victim_of_a_normal_on_demand_job_but_a_higher_class_one_is_not():
    hosts, units = grid({"h1": 1})
    low_spot = spot("low-spot", "5", "h1-g0", prio="low")
    assert preempted(schedule(snapshot(hosts, units, queue=[job("od")], run=[low_spot]))) == {"low-spot": "od"}
    high_spot = spot("high-spot", "0", "h1-g0", prio="high")
    assert preempted(schedule(snapshot(hosts, units, queue=[job("od")], run=[high_spot]))) == {}


def test_a_class_that_may_preempt_takes_interruptibles_before_on_demand_work_of_the_same_lower_class():
    hosts, units = grid({"h1": 1, "h2": 1})
    run = [running(job("od-low", prio="low"), [["h1-g0"]], started_at=50), spot("spot-low", "3", "h2-g0", 0, prio="low")]
    assert preempted(schedule(snapshot(hosts, units, queue=[job("hi", prio="high")], run=run))) == {"spot-low": "hi"}
