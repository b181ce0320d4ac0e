"""The first ``limit`` jobs of the queue order are the first ``limit`` of the whole order.

With a limit, ``QueueOrder.ordered`` keys only the classes the first ``limit`` can come from (lower classes
are counted, never keyed); this checks that shortcut against the whole order, unknown classes included.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from management.scheduler import Job, Snapshot
from management.scheduler.order import QueueOrder

jobs_st = st.lists(
    st.tuples(
        st.sampled_from(["critical", "high", "normal", "low", "no-such-class"]),
        st.integers(0, 5),  # account
        st.floats(0, 8000, allow_nan=False),  # submitted at (aging over a 10,000 s wait)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@example([("critical", 0, 0.0)] * 4 + [("low", 1, 0.0)] * 3, 5, {})  # the cut falls just past a class
@example([("high", 0, 0.0)] * 3 + [("no-such-class", 1, 0.0)] * 3, 4, {})
@given(jobs_st, st.integers(1, 70), st.dictionaries(st.sampled_from([f"a{i}" for i in range(6)]), st.floats(0, 1e6)))
def test_the_first_jobs_by_a_limit_are_the_head_of_the_whole_order(spec, limit, usage):
    queue = [Job(f"wl-{i:03d}", f"a{acct}", priority=prio, submitted_at=t) for i, (prio, acct, t) in enumerate(spec)]
    order = QueueOrder(Snapshot(10_000.0, {}, {}, {}, {}, queue, usage=usage))
    whole = order.ordered(queue)
    assert [j.id for j in order.ordered(queue, limit)] == [j.id for j in whole[:limit]]
