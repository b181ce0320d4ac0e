"""The explanation view: the core's explanation as it is, its two times as RFC 3339."""

from __future__ import annotations

from management.scheduler.model import Explanation
from management.views.workloads import explanation_view


def test_the_explanation_view_keeps_the_sentences_and_writes_its_times_as_rfc3339():
    e = Explanation("wl-1", 2, 2, summary="Next in line for room.", blocked_by="a workload", reserved_start=1795380123.0)
    view = explanation_view(e)
    assert (view.summary, view.blocked_by, view.job_id) == ("Next in line for room.", "a workload", "wl-1")
    assert (view.reserved_start, view.estimated_start, view.cannot_fit) == ("2026-11-22T20:42:03.000Z", None, None)
