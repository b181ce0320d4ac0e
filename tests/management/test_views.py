"""The wording fixes ``management/views.py`` applies to the scheduler's explanations."""

from __future__ import annotations

from management.scheduler.model import Explanation
from management.views import explanation_view, readable_times, renter_words


def test_a_core_moment_that_is_the_explanations_own_start_becomes_rfc3339_and_any_other_is_left_alone():
    start = 1795380123.456
    text = f"reserved from t={start:g}, when running jobs end."
    assert readable_times(text, [None, start]) == "reserved from 2026-11-22T20:42:03.456Z, when running jobs end."
    assert readable_times("at t=12345.6.", [start]) == "at t=12345.6."  # not a moment it knows: unchanged
    assert readable_times("start=5 and t=", [start]) == "start=5 and t="


def test_the_renter_reads_workload_where_the_core_says_job():
    said = "A job with a max duration could start; this job asks; 2 lower-priority job(s); smaller jobs; jobsite"
    assert renter_words(said) == (
        "A workload with a max duration could start; this workload asks; 2 lower-priority workload(s); smaller workloads; jobsite"
    )


def test_the_explanation_view_applies_both_to_the_sentences_only():
    e = Explanation(
        "wl-1", 2, 2, summary=f"First in line from t={1795380123.0:g}.", blocked_by="a job", reserved_start=1795380123.0
    )
    view = explanation_view(e)
    assert view["summary"] == "First in line from 2026-11-22T20:42:03.000Z."
    assert (view["blocked_by"], view["reserved_start"], view["job_id"]) == ("a workload", "2026-11-22T20:42:03.000Z", "wl-1")
