"""The rules of a top-up, pure (management/payments/topups.py): bounds, minor units, and what each verified event does;
and the payment settings read from the Master's configuration (management/settings.py ``PaymentSettings``)."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from management.payments.provider import OtherEvent, TopupFailed, TopupPaid
from management.payments.records import TopupRecord
from management.payments.topups import (
    Credit,
    Ignore,
    InvalidTopup,
    MarkFailed,
    Refuse,
    TopupLimits,
    check_topup,
    from_minor,
    judge,
    to_minor,
)
from management.settings import PaymentSettings
from master.config import MasterConfig

LIMITS = TopupLimits(min_amount=5_000_000, max_amount=500_000_000)
TOPUP = TopupRecord(
    id="tu-1", account="ann", amount=25_000_000, currency="USD", provider="stripe", reference="pi_1", created_at=0.0
)


def paid(**kw: object) -> TopupPaid:
    fields: dict[str, object] = {
        "event_id": "evt_1",
        "kind": "payment_intent.succeeded",
        "reference": "pi_1",
        "topup_id": "tu-1",
        "amount": 25_000_000,
        "currency": "USD",
    }
    return TopupPaid(**(fields | kw))  # type: ignore[arg-type]


def test_minor_units_follow_the_currency_s_decimals() -> None:
    assert to_minor(25_500_000, "USD") == 2550 and from_minor(2550, "usd") == 25_500_000
    assert to_minor(1_000_000_000, "JPY") == 1000 and from_minor(1000, "JPY") == 1_000_000_000
    assert to_minor(1_234_000, "KWD") == 1234
    with pytest.raises(InvalidTopup, match="smallest unit"):
        to_minor(25_001_000, "USD")
    with pytest.raises(InvalidTopup, match="smallest unit"):
        to_minor(1_500_000, "JPY")


@pytest.mark.parametrize(
    ("amount", "says"),
    [(0, "more than 0"), (-1_000_000, "more than 0"), (4_990_000, "at least 5.00"), (500_010_000, "at most 500.00")],
)
def test_a_topup_outside_its_bounds_is_refused_naming_the_bound(amount: int, says: str) -> None:
    with pytest.raises(InvalidTopup, match=says):
        check_topup(amount, "USD", LIMITS)


def test_a_topup_within_its_bounds_is_its_minor_units() -> None:
    assert check_topup(5_000_000, "USD", LIMITS) == 500
    assert check_topup(500_000_000, "USD", LIMITS) == 50_000


def test_a_paid_event_of_the_grid_s_topup_credits_what_arrived_under_the_topup_s_key() -> None:
    assert judge(paid(amount=24_000_000), TOPUP, "USD") == Credit(TOPUP, 24_000_000, "topup:tu-1")
    assert judge(paid(event_id="evt_2"), TOPUP, "USD") == Credit(TOPUP, 25_000_000, "topup:tu-1")  # one key per top-up


def test_what_is_not_credited() -> None:
    assert isinstance(judge(paid(), None, "USD"), Ignore)  # a payment the grid did not open
    assert isinstance(judge(paid(currency="EUR"), TOPUP, "USD"), Refuse)
    assert isinstance(judge(paid(reference="pi_other"), TOPUP, "USD"), Refuse)  # names the top-up, not its payment
    assert isinstance(judge(paid(amount=0), TOPUP, "USD"), Refuse)
    assert isinstance(judge(OtherEvent(event_id="evt_3", kind="charge.refunded"), TOPUP, "USD"), Ignore)


def test_a_failed_payment_marks_a_pending_topup_failed_and_nothing_else() -> None:
    failed = TopupFailed(
        event_id="evt_4", kind="payment_intent.payment_failed", reference="pi_1", topup_id="tu-1", reason="declined"
    )
    assert judge(failed, TOPUP, "USD") == MarkFailed(TOPUP, "declined")
    credited = TopupRecord(**{**{f: getattr(TOPUP, f) for f in TOPUP.__struct_fields__}, "state": "credited"})
    assert isinstance(judge(failed, credited, "USD"), Ignore)  # a late failure does not undo a credit
    # A payment that failed, then succeeded with another card, is credited.
    assert isinstance(
        judge(paid(), TopupRecord(**{**{f: getattr(TOPUP, f) for f in TOPUP.__struct_fields__}, "state": "failed"}), "USD"),
        Credit,
    )


def test_the_settings_refuse_stripe_without_its_secrets_and_bounds_upside_down() -> None:
    with pytest.raises(ConfigError, match="stripe_api_key and stripe_webhook_secret"):
        PaymentSettings.of(MasterConfig(payment_provider="stripe", stripe_api_key="sk_test_x"))
    with pytest.raises(ConfigError, match="topup_min"):
        PaymentSettings.of(MasterConfig(topup_min="50", topup_max="10"))
    with pytest.raises(ConfigError, match="topup_min"):
        PaymentSettings.of(MasterConfig(topup_min="0"))
    settings = PaymentSettings.of(
        MasterConfig(payment_provider="stripe", stripe_api_key="sk_live_hidden", stripe_webhook_secret="whsec_hidden")
    )
    assert settings.limits == TopupLimits(5_000_000, 10_000_000_000)
    assert "hidden" not in repr(settings)
