"""The rules of an auto top-up, pure (no I/O, no clock): what settings the grid takes, and when a charge is due.

A renter with a saved payment method may ask the grid to top up ``amount`` whenever its balance falls below
``threshold`` (RunPod's shape). Invariants (tests/management/payments/test_auto_topup.py):
- a charge is due only with auto top-up on, a saved method, and the balance below the threshold;
- at most one try per ``min_interval_s`` (an hour by default), whether the last try was paid, declined or is still on
  its way: a declined card is not hammered, and a slow webhook does not make a second charge;
- the amount is a top-up the grid takes (``check_topup``'s bounds), and the threshold is within them too, so the
  setting cannot make the grid charge a huge or negative sum.
"""

from __future__ import annotations

from management.market.money import format_amount
from management.payments.records import AutoTopup, BillingRecord
from management.payments.topups import InvalidTopup, TopupLimits, check_topup


def check_auto_topup(setting: AutoTopup, currency: str, limits: TopupLimits) -> AutoTopup:
    """``setting`` when the grid takes it; InvalidTopup naming what is wrong otherwise."""
    check_topup(setting.amount, currency, limits)
    if setting.threshold < 0:
        raise InvalidTopup(f"threshold must be 0 or more, not {format_amount(setting.threshold)}")
    if setting.threshold > limits.max_amount:
        raise InvalidTopup(
            f"threshold must be at most {format_amount(limits.max_amount)} {currency}, not {format_amount(setting.threshold)}"
        )
    return setting


def auto_topup_due(record: BillingRecord, balance: int, now: float, *, min_interval_s: float) -> bool:
    """Whether the renter of ``record``, whose balance left is ``balance`` micro-units, is to be charged its auto
    top-up at ``now``."""
    setting = record.auto_topup
    if setting is None or not setting.enabled or not record.payment_method:
        return False
    if balance >= setting.threshold:
        return False
    last = record.last_auto_topup_at
    return last is None or now - last >= min_interval_s or now < last  # a clock set back does not block it for ever
