"""Load-balanced mode's pure choices (management/endpoints/balancer.py): each invariant of its docstring as a
hypothesis property of the same name, and the hold bounds by example."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from management.endpoints.balancer import Admission, Backend, HoldLimits, admit, expired, pick

ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
backends = st.lists(
    st.builds(Backend, worker_id=ids, ready=st.booleans(), outstanding=st.integers(0, 20)),
    max_size=8,
    unique_by=lambda b: b.worker_id,
)


@given(backends, ids | st.just(""))
def test_never_picks_unready(found: list[Backend], after: str) -> None:
    chosen = pick(found, after)
    ready = {b.worker_id for b in found if b.ready}
    assert (chosen is None) == (not ready)
    assert chosen is None or chosen in ready


@given(backends, ids | st.just(""))
def test_picks_least_outstanding(found: list[Backend], after: str) -> None:
    chosen = pick(found, after)
    if chosen is not None:
        count = {b.worker_id: b.outstanding for b in found}[chosen]
        assert all(count <= b.outstanding for b in found if b.ready)


@given(st.lists(ids, min_size=1, max_size=8, unique=True), st.integers(0, 5))
def test_ties_rotate(workers: list[str], outstanding: int) -> None:
    after, seen = "", []
    for _ in workers:  # equal backends, nothing finishing: each pick stays tied with the others only by rotation
        chosen = pick([Backend(w, True, outstanding) for w in workers], after)
        assert chosen is not None
        seen.append(chosen)
        after = chosen
    assert sorted(seen) == sorted(workers)  # every one once before any twice


@given(st.lists(ids, min_size=1, max_size=8, unique=True), st.integers(0, 50))
def test_spread_within_one(workers: list[str], requests: int) -> None:
    counts: Counter[str] = Counter({w: 0 for w in workers})
    after = ""
    for _ in range(requests):
        chosen = pick([Backend(w, True, counts[w]) for w in workers], after)
        assert chosen is not None
        counts[chosen] += 1
        after = chosen
    assert max(counts.values()) - min(counts.values()) <= 1


@given(st.integers(0, 1000), st.integers(0, 300))
def test_holds_are_bounded(held: int, max_held: int) -> None:
    admitted = admit(held, HoldLimits(max_held=max_held))
    assert (admitted is Admission.HOLD) == (held < max_held)


def test_a_held_request_expires_after_its_bound() -> None:
    limits = HoldLimits(max_hold_s=120.0)
    assert not expired(100.0, 219.9, limits)
    assert expired(100.0, 220.0, limits)
    assert admit(0, HoldLimits(max_held=0)) is Admission.REFUSE  # holding turned off: a 503 at once
