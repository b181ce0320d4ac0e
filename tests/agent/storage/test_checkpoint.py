"""What a checkpoint upload sends and what the input cache evicts: pure rules, with their invariants as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.storage.cache import CacheEntry, evictions
from agent.storage.checkpoint import Seen, plan_upload, safe_rel

files = st.dictionaries(
    st.sampled_from(["a", "b", "c/d", "c/e", "f"]), st.builds(Seen, st.integers(0, 3), st.integers(0, 3)), max_size=5
)


def test_a_first_upload_sends_everything_under_generation_one():
    plan = plan_upload("p/", {"a": Seen(1, 1), "c/d": Seen(2, 2)}, None, 10.0)
    assert plan.send == {"a": "p/data/00000001/a", "c/d": "p/data/00000001/c/d"}
    assert plan.manifest.generation == 1 and plan.manifest.size == 3 and plan.drop == []


@given(files, files)
def test_an_upload_sends_only_what_changed_and_drops_only_what_no_manifest_names(first, second):
    one = plan_upload("p/", first, None, 1.0)
    two = plan_upload("p/", second, one.manifest, 2.0)
    for rel, seen in second.items():
        unchanged = first.get(rel) == seen
        assert (rel not in two.send) == unchanged
    named = {f.key for f in two.manifest.files.values()}
    assert set(two.send.values()) <= named  # every key sent is named by the new manifest
    assert not set(two.drop) & named  # nothing the new manifest names is dropped
    assert set(two.manifest.files) == set(second)
    # every key the manifest names was sent now or earlier
    assert named <= set(two.send.values()) | set(one.send.values())


def test_a_manifest_path_outside_the_directory_is_not_safe():
    assert safe_rel("a/b") and not safe_rel("../x") and not safe_rel("/etc/passwd") and not safe_rel("a//b")


def test_eviction_takes_the_least_recently_used_entries_nobody_holds():
    entries = {
        "old": CacheEntry(size=4, last_used=1),
        "held": CacheEntry(size=4, last_used=0),
        "new": CacheEntry(size=4, last_used=9),
    }
    assert evictions(entries, ["held"], need=4, budget=12) == ["old"]
    assert evictions(entries, ["held"], need=8, budget=12) == ["old", "new"]
    assert evictions(entries, ["held"], need=9, budget=12) is None  # cannot fit beside what is held
    assert evictions(entries, [], need=0, budget=12) == []
