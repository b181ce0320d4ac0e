"""``python -m bench.gcwatch OUT MODULE ARGS``: run ``python -m MODULE ARGS`` and record its garbage collector's pauses.

A full collection walks every object of the process and stops its event loop meanwhile; with the state of
thousands of agents that can take a second, and it shows up as latency nothing else explains. The figures
(collections and longest pause per generation, total pause) are written to OUT every second, as JSON.
"""

from __future__ import annotations

import json
import runpy
import sys
import threading
import time
from pathlib import Path

from bench.fleet_agents import GcPauses

WRITE_EVERY_S = 1.0


def _write_forever(out: Path, pauses: GcPauses) -> None:
    while True:
        time.sleep(WRITE_EVERY_S)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(pauses.figures()))
        tmp.replace(out)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m bench.gcwatch OUT MODULE [ARGS]")
    out, module = Path(sys.argv[1]), sys.argv[2]
    pauses = GcPauses()
    pauses.install()
    threading.Thread(target=_write_forever, args=(out, pauses), daemon=True, name="gcwatch").start()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
