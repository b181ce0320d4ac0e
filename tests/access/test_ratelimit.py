"""Token buckets: a burst at once, then a steady rate; and the speed test's allowance per client address."""

from access.ratelimit import KeyedRateLimiter, TokenBucket, TransferGate


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


def test_a_retuned_bucket_keeps_the_tokens_it_had_and_is_no_fresh_burst():
    bucket = TokenBucket(rate=200.0, burst=200, now=0.0)
    assert sum(bucket.allow(0.0) for _ in range(250)) == 200  # its burst, spent
    bucket.retune(400.0, 400, now=0.01)  # the Master's admission doubled: two tokens came at the old rate, no more
    assert sum(bucket.allow(0.01) for _ in range(10)) == 2
    assert sum(bucket.allow(0.11) for _ in range(100)) == 40  # then the new rate
    bucket.retune(20.0, 20, now=10.0)  # lowered: what it held shrinks to the new burst
    assert sum(bucket.allow(10.0) for _ in range(100)) == 20


def test_keys_have_their_own_buckets_and_forgotten_keys_start_full():
    now = [0.0]
    limiter = KeyedRateLimiter(rate=0.1, burst=1, max_keys=2, clock=lambda: now[0])
    assert limiter.allow("10.0.0.1") and not limiter.allow("10.0.0.1")
    assert limiter.allow("10.0.0.2")
    assert limiter.allow("10.0.0.3")  # forgets 10.0.0.1, the least recently seen
    assert limiter.allow("10.0.0.1")


def test_speed_test_transfers_at_once_are_capped_per_address_and_ending_one_frees_a_place():
    gate = TransferGate(max_transfers=2, bytes_per_window=1_000, window_s=10.0, clock=lambda: 0.0)
    assert gate.begin("10.0.0.1", 10) is None and gate.begin("10.0.0.1", 10) is None
    refusal = gate.begin("10.0.0.1", 10)
    assert refusal is not None and refusal.reason == "transfers" and "at most 2 transfers at once" in refusal.message
    assert gate.begin("10.0.0.2", 10) is None  # another address has places of its own
    gate.end("10.0.0.1")
    assert gate.begin("10.0.0.1", 10) is None


def test_speed_test_bytes_per_window_run_out_and_refill_evenly_over_the_window():
    now = [0.0]
    gate = TransferGate(max_transfers=8, bytes_per_window=1_000, window_s=10.0, clock=lambda: now[0])
    for _ in range(4):
        assert gate.begin("10.0.0.1", 250) is None
        gate.end("10.0.0.1")
    refusal = gate.begin("10.0.0.1", 250)
    assert refusal is not None and refusal.reason == "bytes"
    assert refusal.retry_after_s == 2.5  # 100 bytes a second come back: 250 in 2.5 s
    assert "1000 bytes per 10 s" in refusal.message and gate.transfers("10.0.0.1") == 0  # a refusal holds no place
    now[0] = 2.5
    assert gate.begin("10.0.0.1", 250) is None


def test_a_transfer_larger_than_the_whole_window_is_refused_outright():
    gate = TransferGate(max_transfers=8, bytes_per_window=1_000, window_s=10.0, clock=lambda: 0.0)
    refusal = gate.begin("10.0.0.1", 1_001)
    assert refusal is not None and refusal.reason == "bytes" and "more than this endpoint moves" in refusal.message


def test_bytes_of_undeclared_size_are_charged_after_the_fact():
    gate = TransferGate(max_transfers=8, bytes_per_window=1_000, window_s=10.0, clock=lambda: 0.0)
    assert gate.begin("10.0.0.1", 0) is None
    gate.charge("10.0.0.1", 900)
    gate.end("10.0.0.1")
    assert gate.begin("10.0.0.1", 200) is not None
