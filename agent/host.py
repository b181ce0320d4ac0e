"""Facts about the host an agent runs on: CPU, memory, disk, operating system.

Bandwidth fields stay None here; the agent fills them from ``agent.bandwidth`` once measured.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import socket
from pathlib import Path

from common.inventory import HostInfo

GIB = 1024**3
CPUINFO, MEMINFO, OS_RELEASE = Path("/proc/cpuinfo"), Path("/proc/meminfo"), Path("/etc/os-release")


def collect_host_info(state_dir: Path | None = None) -> HostInfo:
    """``state_dir`` is where the agent keeps its files: the disk figures are of the disk holding it."""
    disk = shutil.disk_usage(_nearest_existing(state_dir or Path("/")))
    return HostInfo(
        hostname=socket.gethostname(),
        cpu_model=cpu_model_from(_read(CPUINFO)) or platform.processor() or platform.machine(),
        cpu_cores=os.cpu_count() or 1,
        ram_mib=mem_total_mib_from(_read(MEMINFO)) or _ram_mib_from_sysconf(),
        disk_total_gib=round(disk.total / GIB, 1),
        disk_free_gib=round(disk.free / GIB, 1),
        os=os_pretty_name_from(_read(OS_RELEASE)) or f"{platform.system()} {platform.release()}",
        kernel=platform.release(),
    )


def cpu_model_from(cpuinfo: str) -> str:
    """x86 names the model in "model name"; some ARM kernels only in "Model" or "Hardware"."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    return next((fields[key] for key in ("model name", "model", "hardware") if key in fields), "")


def mem_total_mib_from(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024  # the kernel writes kB (KiB)
    return 0


def os_pretty_name_from(os_release: str) -> str:
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME":
            return " ".join(shlex.split(value))  # the value is shell-quoted
    return ""


def _ram_mib_from_sysconf() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _nearest_existing(path: Path) -> Path:
    """The state directory may not exist before the first run; its disk is its nearest ancestor's."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
