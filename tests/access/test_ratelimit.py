"""Token buckets: a burst at once, then a steady rate."""

from access.ratelimit import KeyedRateLimiter, TokenBucket


def test_a_bucket_allows_its_burst_then_its_rate():
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.allow(0.5) and not bucket.allow(0.5)  # 2/s: one token per half second
    assert [bucket.allow(100.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst


def test_charged_frames_put_the_bucket_in_debt():
    bucket = TokenBucket(rate=1.0, burst=2, now=0.0)
    for _ in range(4):
        bucket.charge(0.0)
    assert not bucket.allow(1.0)  # two frames of debt: the next two seconds pay for them
    assert not bucket.allow(2.0)
    assert bucket.allow(3.0)


def test_keys_have_their_own_buckets_and_forgotten_keys_start_full():
    now = [0.0]
    limiter = KeyedRateLimiter(rate=0.1, burst=1, max_keys=2, clock=lambda: now[0])
    assert limiter.allow("10.0.0.1") and not limiter.allow("10.0.0.1")
    assert limiter.allow("10.0.0.2")
    assert limiter.allow("10.0.0.3")  # forgets 10.0.0.1, the least recently seen
    assert limiter.allow("10.0.0.1")
