"""The rules of spend caps (management/payments/caps.py), pure: the windows, what was spent in one, which caps are
reached, which settings are refused, and the blocks the scheduler reads."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from management.market.charges import cost_until
from management.payments.caps import (
    MAX_CAPS,
    CapBlocks,
    InvalidCaps,
    check_caps,
    cost_in,
    describe,
    read_caps,
    spent,
    window_start,
)
from management.payments.records import SpendCap
from master.records import RentalHost, RentalRecord

NOW = datetime(2026, 12, 7, 12, 30, tzinfo=UTC).timestamp()
MONTH = datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def rental(rid: str, workload: str, start: float, end: float | None = None, **kw) -> RentalRecord:
    host = RentalHost(agent_id="agt-1", provider="prov", gpus=1, price=3_600_000)  # 1000 a second
    return RentalRecord(id=rid, workload_id=workload, account="ann", kind="on_demand", hosts=[host], started_at=start,
                        ended_at=end, **kw)  # fmt: skip


def test_the_hour_is_rolling_and_the_month_is_the_utc_calendar_month():
    assert window_start("hour", NOW) == NOW - 3600
    assert window_start("month", NOW) == MONTH


def test_spending_counts_only_inside_the_window_and_of_the_capped_project():
    rentals = [
        rental("a", "wl-train", NOW - 7200, NOW - 1800),  # 1800 s inside the hour
        rental("b", "wl-serve", NOW - 600),  # open: 600 s, of another project
        rental("c", "wl-train", NOW - 5000, NOW - 4000),  # ended before the hour: this month only
        rental("d", "wl-train", NOW - 900, NOW - 300, host_failure="agt-1: went offline"),  # refunded: nothing
    ]
    projects = {"wl-train": "train", "wl-serve": "serve"}
    hour = SpendCap(window="hour", limit=1)
    train_hour = SpendCap(scope="project", project="train", window="hour", limit=1)
    train_month = SpendCap(scope="project", project="train", window="month", limit=1)
    assert spent(hour, rentals, projects, NOW) == 1_800_000 + 600_000
    assert spent(train_hour, rentals, projects, NOW) == 1_800_000
    assert spent(train_month, rentals, projects, NOW) == 5_400_000 + 1_000_000


def test_a_cap_is_reached_at_its_limit_not_before():
    rentals = [rental("a", "wl-1", NOW - 100)]
    below, at = SpendCap(window="hour", limit=100_001), SpendCap(window="hour", limit=100_000)
    readings = read_caps([below, at], rentals, {}, NOW)
    assert [(r.spent, r.reached) for r in readings] == [(100_000, False), (100_000, True)]


@given(start=st.floats(-10_000, 10_000), length=st.floats(0, 20_000), cut=st.floats(-10_000, 20_000))
def test_a_rentals_cost_splits_exactly_at_any_moment(start, length, cut):
    r = rental("a", "wl-1", NOW + start, NOW + start + length)
    end = NOW + start + length
    whole = cost_until(r, end)
    assert cost_in(r, NOW - 10**6, NOW + cut) + cost_in(r, NOW + cut, NOW + 10**6) == whole


@pytest.mark.parametrize(
    ("caps", "said"),
    [
        ([SpendCap(window="hour", limit=-1)], "more than 0"),
        ([SpendCap(window="hour", limit=0)], "more than 0"),
        ([SpendCap(window="month", limit=10**18)], "at most"),
        ([SpendCap(scope="project", window="hour", limit=5)], "names its project"),
        ([SpendCap(project="train", window="hour", limit=5)], "names no project"),
        ([SpendCap(window="hour", limit=5), SpendCap(window="hour", limit=9)], "same scope, window and kind"),
        ([SpendCap(window="hour", limit=n + 1, hard=bool(n % 2)) for n in range(MAX_CAPS + 1)], f"at most {MAX_CAPS}"),
    ],
)
def test_caps_the_grid_does_not_take_are_refused_with_the_reason(caps, said):
    with pytest.raises(InvalidCaps) as caught:
        check_caps(caps)
    assert said in str(caught.value)


def test_a_soft_and_a_hard_cap_of_one_window_are_taken_together():
    caps = [SpendCap(window="hour", limit=5), SpendCap(window="hour", limit=9, hard=True)]
    assert check_caps(caps) == caps
    assert describe(caps[1], "USD") == "the hard cap of 0.000009 USD per hour on the account"


def test_blocks_are_per_account_and_project_and_replaced_whole():
    blocks = CapBlocks()
    blocks.replace("ann", {"train": "the cap on train"})
    blocks.replace("bob", {"": "bob's cap"})
    assert blocks.reason("ann", "train") == "the cap on train" and blocks.reason("ann", "serve") == ""
    assert blocks.reason("bob", "anything") == "bob's cap" and blocks.reason("cy", "train") == ""
    blocks.replace("ann", {})
    assert blocks.reason("ann", "train") == "" and blocks.reason("bob", "x") == "bob's cap"
