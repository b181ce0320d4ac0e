"""Reconnect delays grow exponentially, are capped, and are spread out (full jitter)."""

import random

from agent.backoff import full_jitter


def test_delays_stay_within_the_exponential_ceiling_and_the_cap():
    rng = random.Random(1)
    for attempt in range(40):
        delay = full_jitter(attempt, initial_s=0.5, max_s=30, rng=rng)
        assert 0 <= delay <= min(30, 0.5 * 2**attempt)


def test_a_thousand_agents_do_not_retry_in_step():
    rng = random.Random(7)
    delays = [full_jitter(6, initial_s=0.5, max_s=30, rng=rng) for _ in range(1000)]
    buckets = {int(d) for d in delays}
    assert len(buckets) >= 25  # spread over the whole [0, 30) window, not a spike
