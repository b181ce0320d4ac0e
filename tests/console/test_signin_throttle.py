"""The sign-in throttle on its own (a clock passed in): per (account, address) and per address, never the account
alone (D13), and a bounded table that junk attempts cannot empty of the buckets that still throttle (D19)."""

from __future__ import annotations

from management.console.throttle import SignInThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_spent_attempts_for_an_account_from_one_address_leave_the_account_open_from_another():
    throttle = SignInThrottle(burst=5, per_minute=5.0, clock=Clock())
    for _ in range(5):
        assert throttle.wait_s("rita", "203.0.113.7") == 0
    assert throttle.wait_s("rita", "203.0.113.7") > 0  # that address, that account: throttled
    assert throttle.wait_s("rita", "198.51.100.2") == 0  # the owner, from a fresh address
    assert throttle.wait_s("Rita", "203.0.113.7") > 0  # the account name's case changes nothing


def test_one_address_is_throttled_across_every_account_it_tries():
    throttle = SignInThrottle(burst=3, per_minute=1.0, clock=Clock())
    for account in ("a", "b", "c"):
        assert throttle.wait_s(account, "203.0.113.7") == 0
    assert throttle.wait_s("d", "203.0.113.7") > 0
    assert throttle.wait_s("d", "198.51.100.2") == 0


def test_a_refused_attempt_creates_no_bucket():
    throttle = SignInThrottle(burst=1, per_minute=1.0, clock=Clock())
    assert throttle.wait_s("a", "203.0.113.7") == 0
    tracked = len(throttle)
    for n in range(1000):
        assert throttle.wait_s(f"junk-{n}", "203.0.113.7") > 0
    assert len(throttle) == tracked


def test_ten_thousand_junk_attempts_do_not_make_the_throttle_forget_the_targets_bucket():
    throttle = SignInThrottle(burst=5, per_minute=5.0, clock=Clock())  # the default table size
    for _ in range(5):
        assert throttle.wait_s("victim", "203.0.113.7") == 0
    for n in range(20_000):  # refused attempts, each naming another account: twice the table's size
        throttle.wait_s(f"junk-{n}", "203.0.113.7")
    assert throttle.wait_s("victim", "203.0.113.7") > 0


def test_junk_attempts_from_many_addresses_never_evict_a_bucket_that_still_throttles():
    clock = Clock()
    throttle = SignInThrottle(burst=3, per_minute=1.0, clock=clock, max_tracked=100)
    for _ in range(3):
        assert throttle.wait_s("victim", "203.0.113.7") == 0
    assert throttle.wait_s("victim", "203.0.113.7") > 0
    # Ten thousand attempts, each from a fresh address (each let in, each adding two buckets) in the same instant.
    for n in range(10_000):
        throttle.wait_s(f"junk-{n}", f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(throttle) <= 100
    assert throttle.wait_s("victim", "203.0.113.7") > 0  # still throttled: its bucket was not forgotten


def test_refilled_buckets_are_forgotten_first_and_a_full_table_of_throttling_buckets_makes_newcomers_wait():
    clock = Clock()
    throttle = SignInThrottle(burst=1, per_minute=1.0, clock=clock, max_tracked=4)
    assert throttle.wait_s("a", "203.0.113.1") == 0
    assert throttle.wait_s("b", "203.0.113.2") == 0  # 4 buckets, all throttling now
    assert throttle.wait_s("c", "203.0.113.3") > 0  # no room: waits rather than forgets a throttling bucket
    assert throttle.wait_s("a", "203.0.113.1") > 0
    clock.now += 61.0  # every bucket has refilled: forgetting them loses nothing
    assert throttle.wait_s("c", "203.0.113.3") == 0
    assert len(throttle) <= 4
