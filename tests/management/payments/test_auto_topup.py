"""The rules of an auto top-up (management/payments/auto_topup.py), pure: when a charge is due, at most once an
interval, and which settings are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from management.payments.auto_topup import auto_topup_due, check_auto_topup
from management.payments.records import AutoTopup, BillingRecord
from management.payments.topups import InvalidTopup, TopupLimits

LIMITS = TopupLimits(min_amount=5_000_000, max_amount=10_000_000_000)
T = 1_700_000_000.0
HOUR = 3600.0


def record(**kw) -> BillingRecord:
    kw.setdefault("auto_topup", AutoTopup(threshold=10_000_000, amount=25_000_000))
    return BillingRecord(id="alice", customer="cus_1", payment_method=kw.pop("payment_method", "pm_1"), **kw)


def test_a_charge_is_due_below_the_threshold_with_a_saved_method_and_auto_top_up_on():
    assert auto_topup_due(record(), 9_999_999, T, min_interval_s=HOUR)
    assert not auto_topup_due(record(), 10_000_000, T, min_interval_s=HOUR)  # at the threshold: not below it
    assert not auto_topup_due(record(payment_method=""), 0, T, min_interval_s=HOUR)
    assert not auto_topup_due(record(auto_topup=None), 0, T, min_interval_s=HOUR)
    off = AutoTopup(enabled=False, threshold=10_000_000, amount=25_000_000)
    assert not auto_topup_due(record(auto_topup=off), 0, T, min_interval_s=HOUR)


@given(since=st.floats(0, 3 * HOUR, allow_nan=False), balance=st.integers(-(10**12), 10**12))
def test_at_most_one_try_an_hour_whatever_came_of_the_last(since, balance):
    due = auto_topup_due(record(last_auto_topup_at=T), balance, T + since, min_interval_s=HOUR)
    assert due == (since >= HOUR and balance < 10_000_000)


@pytest.mark.parametrize(
    ("threshold", "amount", "said"),
    [
        (10_000_000, -25_000_000, "more than 0"),
        (10_000_000, 0, "more than 0"),
        (10_000_000, 1_000_000, "at least 5.00"),
        (10_000_000, 10**18, "at most 10000.00"),
        (10_000_000, 25_000_001, "smallest unit"),
        (-1, 25_000_000, "threshold must be 0 or more"),
        (10**18, 25_000_000, "threshold must be at most"),
    ],
)
def test_negative_tiny_huge_or_odd_settings_are_refused_with_the_reason(threshold, amount, said):
    with pytest.raises(InvalidTopup) as caught:
        check_auto_topup(AutoTopup(threshold=threshold, amount=amount), "USD", LIMITS)
    assert said in str(caught.value)


def test_a_setting_within_the_bounds_is_taken():
    setting = AutoTopup(threshold=0, amount=5_000_000)
    assert check_auto_topup(setting, "USD", LIMITS) is setting
