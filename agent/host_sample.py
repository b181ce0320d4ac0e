"""The host's own telemetry, read from Linux's /proc and the state directory's file system: CPU busy share, load,
memory, disk and network counters. Cheap (a few small files per sample) and without a dependency; on a system
without /proc each reading is None, never an error."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from common.inventory import HostSample

log = logging.getLogger(__name__)

GIB = 1024**3


class HostSampler:
    """Samples the host. CPU busy share needs two readings of /proc/stat: the first sample has none."""

    def __init__(self, disk_path: Path, *, proc: Path = Path("/proc")) -> None:
        self._disk_path = disk_path
        self._proc = proc
        self._cpu: tuple[int, int] | None = None  # (busy, total) jiffies of the previous reading

    def sample(self, now: float) -> HostSample:
        used, total = self._memory()
        disk_used, disk_free = self._disk()
        rx, tx = self._network()
        return HostSample(
            ts=now,
            cpu_pct=self._cpu_pct(),
            load_1m=self._load(),
            ram_used_mib=used,
            ram_total_mib=total,
            disk_used_gib=disk_used,
            disk_free_gib=disk_free,
            net_rx_bytes=rx,
            net_tx_bytes=tx,
        )

    def _read(self, name: str) -> str | None:
        try:
            return (self._proc / name).read_text()
        except OSError:
            return None

    def _cpu_pct(self) -> float | None:
        text = self._read("stat")
        if not text or not text.startswith("cpu "):
            return None
        fields = [int(v) for v in text.split("\n", 1)[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
        total = sum(fields)
        busy = total - fields[3] - (fields[4] if len(fields) > 4 else 0)
        previous, self._cpu = self._cpu, (busy, total)
        if previous is None or total <= previous[1]:
            return None
        return round(100.0 * (busy - previous[0]) / (total - previous[1]), 1)

    def _load(self) -> float | None:
        text = self._read("loadavg")
        try:
            return float(text.split()[0]) if text else None
        except ValueError:
            return None

    def _memory(self) -> tuple[int | None, int | None]:
        text = self._read("meminfo")
        if not text:
            return None, None
        kib = {}
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                kib[name] = int(parts[0])
        if "MemTotal" not in kib or "MemAvailable" not in kib:
            return None, None
        return (kib["MemTotal"] - kib["MemAvailable"]) // 1024, kib["MemTotal"] // 1024

    def _disk(self) -> tuple[float | None, float | None]:
        try:
            usage = shutil.disk_usage(self._disk_path)
        except OSError:
            return None, None
        return round(usage.used / GIB, 2), round(usage.free / GIB, 2)

    def _network(self) -> tuple[int | None, int | None]:
        text = self._read("net/dev")
        if not text:
            return None, None
        rx = tx = 0
        for line in text.splitlines()[2:]:  # two header lines
            name, _, counters = line.partition(":")
            fields = counters.split()
            if name.strip() == "lo" or len(fields) < 9:
                continue
            rx += int(fields[0])
            tx += int(fields[8])
        return rx, tx


def host_sampler_for(state_path: Path) -> HostSampler | None:
    """A sampler of this host, or None where there is no /proc to read (not Linux)."""
    if not os.path.isdir("/proc"):
        log.info("no /proc here: the host's own CPU, memory and network are not reported")
        return None
    return HostSampler(state_path)
