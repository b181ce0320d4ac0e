"""A CPU competitor for the overload bench: one process per core, each spinning for a fixed share of every period.

It stands for other work on the Master's machine (a noisy neighbour, a backup, a store on the same cores): the
grid's processes get what is left. ``--competitor-share 0.5`` takes about half of each core for the whole run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

PERIOD_S = 0.05  # spin, then sleep, within each period: short enough that the share holds over any second

_SPIN = """
import time, sys
share, period = float(sys.argv[1]), float(sys.argv[2])
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * period:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - start)))
"""


class CpuCompetitor:
    """``with CpuCompetitor(0.5):`` one spinning process per core for the block (none when the share is 0)."""

    def __init__(self, share: float, cores: int | None = None) -> None:
        if not 0.0 <= share < 1.0:
            raise ValueError(f"the competitor's share of each core must be in [0, 1), got {share}")
        self.share = share
        self.cores = cores or os.cpu_count() or 1
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuCompetitor:
        if self.share > 0:
            for core in range(self.cores):
                process = subprocess.Popen([sys.executable, "-c", _SPIN, str(self.share), str(PERIOD_S)])
                if hasattr(os, "sched_setaffinity"):
                    os.sched_setaffinity(process.pid, {core % (os.cpu_count() or 1)})
                self._processes.append(process)
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self._processes:
            process.send_signal(signal.SIGTERM)
        for process in self._processes:
            process.wait(timeout=10)
        self._processes = []


def main() -> None:
    """``python -m bench.competitor SHARE``: compete until SIGTERM or SIGINT (to put beside a bench of another tree)."""
    share = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with CpuCompetitor(share):
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
