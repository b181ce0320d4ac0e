"""bench.gcwatch: the pauses file, and the heap census SIGUSR2 writes (with tracemalloc's lines when asked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A daemon stand-in: it holds 50,000 small lists (the collector tracks every list), asks for its own census, and
# stays a little over a second so the pauses file is written once.
PROGRAM = "import os, signal, time; held = [[i] for i in range(50_000)]; os.kill(os.getpid(), signal.SIGUSR2); time.sleep(1.5)"


def _run(tmp_path: Path, **env: str) -> Path:
    out = tmp_path / "gc.json"
    subprocess.run(
        [sys.executable, "-m", "bench.gcwatch", str(out), "timeit", "-n", "1", "-r", "1", PROGRAM],
        cwd=ROOT,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def test_sigusr2_writes_a_census_of_the_heap_by_type_beside_the_pauses(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert len(json.loads(out.read_text())["collections"]) == 3  # the pauses per generation, as before
    census = (tmp_path / "gc.json.census-1.txt").read_text().splitlines()
    assert census[0].startswith("tracked objects ")
    lists = [line for line in census[1:] if line.endswith("  list")]
    assert lists and int(lists[0].split("B")[1].split()[0].replace(",", "")) >= 50_000  # the 50,000 held lists
    assert not any(line.startswith("tracemalloc") for line in census)


def test_with_tracemalloc_the_census_names_the_lines_that_hold_the_memory(tmp_path: Path) -> None:
    _run(tmp_path, IDLEGRID_BENCH_TRACEMALLOC="1")
    census = (tmp_path / "gc.json.census-1.txt").read_text()
    assert "tracemalloc: " in census and "<timeit-src>:" in census  # the lists were made by the timed statement
