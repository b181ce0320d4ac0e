"""mypy run in-process on one snippet with the project's configuration: the lines it fails, for tests that show a
type makes a mistake impossible (tests/test_master_door.py, tests/master/test_command_specs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parents[2]


def failing_lines(snippet: str, folder: Path, name: str = "snippet.py") -> tuple[list[int], str]:
    """The line numbers of ``snippet`` mypy reports errors on (imports followed silently), and its whole report."""
    module = folder / name
    module.write_text(snippet)
    limit = sys.getrecursionlimit()
    try:
        report, _, _ = mypy_api.run(
            [str(module), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(folder / "mypy-cache")]
            + ["--follow-imports", "silent"]
        )
    finally:
        # mypy raises the recursion limit for the whole process and leaves it there; later tests in the process rely
        # on the default (JSON nested a thousand deep is refused by the decoder's recursion check).
        sys.setrecursionlimit(limit)
    lines = sorted({int(line.split(":")[1]) for line in report.splitlines() if line.startswith(str(module))})
    return lines, report
