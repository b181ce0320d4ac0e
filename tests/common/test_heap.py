"""The daemons' interpreter settings, applied in a process of their own (they are process-wide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_daemon_with_a_worker_thread_gets_the_interpreter_back_within_a_millisecond() -> None:
    code = (
        "import gc, sys\n"
        "from common.heap import share_the_interpreter_quickly, tune_for_daemon\n"
        "before = sys.getswitchinterval()\n"
        "tune_for_daemon(); share_the_interpreter_quickly()\n"
        "print(before, sys.getswitchinterval(), gc.get_threshold()[0], gc.get_threshold()[1], gc.get_freeze_count() > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    before, after, young, middle, frozen = out.split()
    assert float(before) == 0.005 and float(after) == 0.001  # CPython's 5 ms, then 1 ms
    assert int(young) == 20_000 and int(middle) == 5 and frozen == "True"


def test_free_memory_between_live_blocks_goes_back_to_the_kernel() -> None:
    """glibc hands memory back only from the top of its heap: 40 MB freed between blocks still in use stays in the
    process's RSS until ``release_free_memory`` (malloc_trim) gives those pages back. Run in a process of its own so
    that the RSS read is this test's alone."""
    code = (
        "import os\n"
        "from common.heap import release_free_memory\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "blocks = [bytearray(8192) for _ in range(5120)]\n"  # 40 MiB of the C heap (over pymalloc's 512 bytes)
        "kept = blocks[15::16]\n"  # every 16th stays: the freed ones lie between blocks in use, not at the top
        "del blocks\n"
        "before = rss()\n"
        "released = release_free_memory()\n"
        "print(released, before - rss(), len(kept))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    released, dropped, kept = out.split()
    if released == "False" and dropped == "0":
        pytest.skip("this C library has no malloc_trim (not glibc): nothing to release")
    assert released == "True" and int(kept) == 320
    assert int(dropped) > 30 * 1024 * 1024  # most of the 37.5 MiB freed between the kept blocks


def _run(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_a_full_collections_survivors_are_frozen_and_the_next_walks_only_what_came_since() -> None:
    """The Master's setting: after a full collection everything it left alive is frozen, so a later full collection
    neither walks nor frees it; cyclic garbage made after that freeze is still freed. (No complete collection here.)"""
    out = _run(
        "import gc\n"
        "from common.heap import CompletePolicy, SurvivorFreezer, tune_for_daemon\n"
        "tune_for_daemon()\n"
        "first = SurvivorFreezer.install(CompletePolicy(min_interval_s=1e12, floor_objects=0))\n"
        "start = gc.get_freeze_count()\n"
        "state = [[i] for i in range(200_000)]\n"  # an agent's records: alive as long as the process
        "gc.collect()\n"
        "after_state = gc.get_freeze_count()\n"
        "class Node:\n"
        "    pass\n"
        "a, b = Node(), Node(); a.peer, b.peer = b, a\n"  # a cycle made after the freeze, then dropped
        "del a, b\n"
        "freed = gc.collect()\n"
        "walked = len(gc.get_objects(2))\n"  # what the oldest generation holds (the frozen are not in it)
        "again = SurvivorFreezer.install()\n"
        "print(start, after_state, freed, walked, again is first, first.completes, len(state))\n"
    )
    start, after_state, freed, walked, same, completes, kept = out
    assert int(after_state) - int(start) >= 200_000  # the 200,000 lists (and the list holding them) were frozen
    assert int(freed) >= 2  # the two nodes of the dropped cycle (and their dicts)
    assert int(walked) < 10_000  # only what survived since the last freeze: not the 200,000
    assert same == "True" and completes == "0" and int(kept) == 200_000


def test_the_master_freezes_the_survivors_of_its_full_collections() -> None:
    out = _run(
        "import gc\n"
        "from common.heap import SurvivorFreezer, tune_for_daemon\n"
        "before = [c for c in gc.callbacks if isinstance(getattr(c, '__self__', None), SurvivorFreezer)]\n"
        "tune_for_daemon(freeze_survivors=True)\n"
        "after = [c for c in gc.callbacks if isinstance(getattr(c, '__self__', None), SurvivorFreezer)]\n"
        "print(len(before), len(after))\n"
    )
    assert out == ["0", "1"]
    source = (ROOT / "management" / "cli" / "main.py").read_text()
    assert "tune_for_daemon(freeze_survivors=True)" in source.split("def _run_master", 1)[1].split("\ndef ", 1)[0]


def test_once_the_frozen_objects_doubled_a_full_collection_walks_them_and_frees_their_cycles() -> None:
    """The price of freezing: a frozen object that later dies in a cycle stays until a complete collection, which
    comes once the frozen objects have doubled (here at once: no interval): the cycles dropped after they were frozen
    are freed then, and the survivors are frozen again."""
    out = _run(
        "import gc\n"
        "from common.heap import CompletePolicy, SurvivorFreezer, tune_for_daemon\n"
        "tune_for_daemon()\n"
        "class Node:\n"
        "    pass\n"
        "held = []\n"
        "for _ in range(20_000):\n"
        "    a, b = Node(), Node(); a.peer, b.peer = b, a; held.append(a)\n"
        "gc.collect(); gc.freeze()\n"  # frozen while alive
        "freezer = SurvivorFreezer.install(CompletePolicy(min_interval_s=0))\n"
        "del held, a, b\n"  # now cyclic garbage among the frozen: no full collection frees it
        "kept_garbage = gc.collect()\n"
        "growth = [[i] for i in range(2 * gc.get_freeze_count())]\n"  # the heap more than doubles
        "gc.collect()\n"  # freezes the growth, finds a complete collection due, unfreezes everything
        "unfrozen = gc.get_freeze_count()\n"
        "freed = gc.collect()\n"  # the complete one
        "print(kept_garbage, unfrozen, freed, freezer.completes, gc.get_freeze_count() > len(growth))\n"
    )
    kept_garbage, unfrozen, freed, completes, refrozen = out
    assert int(kept_garbage) < 1_000  # the 20,000 frozen cycles were not freed
    assert int(unfrozen) == 0 and completes == "1" and refrozen == "True"
    assert int(freed) >= 40_000  # their 40,000 nodes (and their dicts) were


def test_a_complete_collection_comes_with_doubling_and_above_its_floor_no_sooner_than_its_interval() -> None:
    from common.heap import CompletePolicy

    policy = CompletePolicy()
    assert not policy.due(150_000, 100_000, 0.0)
    assert policy.due(200_000, 100_000, 0.0)  # under the floor: whenever it doubled
    assert not policy.due(4_000_000, 2_000_000, policy.min_interval_s - 1)  # above: not yet
    assert policy.due(4_000_000, 2_000_000, policy.min_interval_s)
    assert not policy.due(3_999_999, 2_000_000, 10 * policy.min_interval_s)  # not doubled
