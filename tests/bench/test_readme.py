"""bench/README.md is the reference: every bench ``python -m bench`` offers has a row of current figures there, with
its command and its target (the dated runs are bench/HISTORY.md's)."""

import argparse
import re
from pathlib import Path

from bench.__main__ import build_parser

README = Path(__file__).resolve().parents[2] / "bench" / "README.md"


def benches() -> list[str]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return sorted(actions[0].choices)


def current_figures() -> str:
    text = README.read_text()
    start = text.index("## Current figures")
    following = re.compile(r"^## ", re.M).search(text, start + 1)
    return text[start : following.start() if following else len(text)]


def rows_of(bench: str, section: str) -> list[str]:
    """The table rows whose command cell runs ``bench``."""
    return [line for line in section.splitlines() if line.startswith("|") and f"`python -m bench {bench}" in line]


def test_every_bench_has_a_row_of_current_figures_with_its_target_and_date():
    section = current_figures()
    for bench in benches():
        rows = rows_of(bench, section)
        assert rows, f"bench/README.md has no current figures for `python -m bench {bench}`"
        for row in rows:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            assert len(cells) == 5, f"a row of {bench} is not bench | command | target | figures | measured: {row}"
            assert cells[2], f"{bench}: no target"
            assert re.search(r"\b20\d\d-\d\d-\d\d\b", cells[4]), f"{bench}: the figures are not dated: {cells[4]}"


def test_the_history_is_dated():
    history = README.with_name("HISTORY.md").read_text()
    undated = [h for h in re.findall(r"^##+ .*$", history, re.M) if not re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
    assert undated == [], f"bench/HISTORY.md sections without a date: {undated}"
