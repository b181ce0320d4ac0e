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
