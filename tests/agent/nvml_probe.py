"""Print this host's GPU inventory and one telemetry sample, read through the real NVML, as JSON.

For checking the NVML collector on a GPU machine: ``python tests/agent/nvml_probe.py``.
Exits 1 with NVML's one-line explanation on a host without a usable NVIDIA driver.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere, without installing

from agent.gpus import NvmlCollector  # noqa: E402
from common.errors import NvmlUnavailable  # noqa: E402


def main() -> int:
    try:
        collector = NvmlCollector()
    except NvmlUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        report = {"inventory": collector.inventory(), "sample": collector.sample()}
    finally:
        collector.close()
    print(msgspec.json.format(msgspec.json.encode(report)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
