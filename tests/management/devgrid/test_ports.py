"""Ports for a local grid's daemons: two processes choosing ports side by side (pytest workers, each with grids of its
own) never choose the same one, even while the first has not bound it yet, and a process's claims end with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from management.devgrid import localgrid
from management.devgrid.localgrid import free_port, port_is_free

ROOT = Path(__file__).resolve().parents[3]
WIDTH = 8


# Run by the other process: it finds WIDTH ports in a row that nothing listens on and no process has claimed (the
# test workers beside this one claim ports for their whole life, so a range that only looks free may not be), claims
# them, lets the fourth go, and says which range.
HOLDER = """
import fcntl, os, sys
from management.devgrid import localgrid
from management.devgrid.localgrid import port_is_free, reserve_port
width = int(sys.argv[1])
low, high = localgrid.LISTEN_PORTS
for base in range(low + 1000, high - width, width * 7):
    ports = range(base, base + width)
    if all(port_is_free(p) for p in ports) and all(reserve_port(p) for p in ports):
        fcntl.lockf(localgrid._reservations[0], fcntl.LOCK_UN, 1, base + 3, os.SEEK_SET)
        print(base, flush=True)
        sys.stdin.read()
        sys.exit(0)
sys.exit("no free range of ports to test with")
"""


def test_a_port_another_process_chose_and_has_not_bound_is_never_chosen_here(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process (a second pytest worker, say) chose every port of a range but one and bound none of them.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(WIDTH)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        base = int(holder.stdout.readline())
        left = base + 3
        others = [p for p in range(base, base + WIDTH) if p != left]
        monkeypatch.setattr(localgrid, "LISTEN_PORTS", (base, base + WIDTH - 1))
        monkeypatch.setattr(localgrid, "_handed_out", set())
        assert all(port_is_free(p) for p in others)  # nothing listens: only the claim keeps them from this process
        assert free_port() == left
        with pytest.raises(RuntimeError, match="no free port"):
            free_port()  # the one left is handed out already; the others are the other process's
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0
    # The other process ended: its claims went with it.
    assert free_port() in others
