"""Helpers for the helper processes the tests start (dnsmasq, nx-27017)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; a process already gone is left alone."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
