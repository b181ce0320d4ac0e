"""What the alert rules watch of a renter's money besides its balance (management/monitoring/observe.py): its spend
caps as the spend-cap watch last read them (``renter.spend_cap_used_pct``) and its failed auto top-ups
(``renter.auto_topup_failed``), as readings labelled with the renter, so that the operator and that renter see the
alerts (management/monitoring/visibility.py) and their webhooks are told. Pure: the composition root hands the
watch's readings and the top-ups' failures in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from management.market.money import format_amount
from management.monitoring.observe import Reading
from management.payments.caps import CapReading, describe
from management.payments.records import SpendCap, TopupRecord


def cap_subject(account: str, cap: SpendCap) -> str:
    """One cap of one renter, as an alert's subject: ``rita/project=train/month/hard``, ``rita/account/hour/soft``."""
    where = f"project={cap.project}" if cap.scope == "project" else "account"
    return f"{account}/{where}/{cap.window}/{'hard' if cap.hard else 'soft'}"


def spend_cap_readings(readings: Mapping[str, Sequence[CapReading]], currency: str) -> list[Reading]:
    """Each cap's spending as a percentage of its limit (100: reached)."""
    return [
        Reading(
            cap_subject(account, r.cap),
            r.spent * 100 / r.cap.limit,
            {
                "renter": account,
                "cap": describe(r.cap, currency),
                "spent": f"{format_amount(r.spent)} {currency}",
                "limit": f"{format_amount(r.cap.limit)} {currency}",
                "hard": "true" if r.cap.hard else "false",
            },
        )
        for account, caps in sorted(readings.items())
        for r in caps
        if r.cap.limit > 0
    ]


def failed_auto_topup_readings(failed: Mapping[str, TopupRecord]) -> list[Reading]:
    """1 for each renter whose latest auto top-up failed, with the amount and the provider's reason."""
    return [
        Reading(
            account,
            1.0,
            {"renter": account, "amount": f"{format_amount(t.amount)} {t.currency}", "reason": t.reason[:200]},
        )
        for account, t in sorted(failed.items())
    ]
