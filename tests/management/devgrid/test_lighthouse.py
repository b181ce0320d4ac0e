"""The lighthouse's parts that need no namespace (management/devgrid/lighthouse.py): where each slot's veth lies, the
Master's ``[overlay]`` that lists it, what the demo says where it cannot run one. Its namespace and nebula run in
tests/e2e/test_demo_gang.py and test_gang_resume.py."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tomllib

import msgspec
import pytest

from management.devgrid.demo import Demo
from management.devgrid.lighthouse import LIGHTHOUSE_ADDRESS, SLOTS, TOOLS, VETH_RANGE, overlay_toml, veth_pair
from master.config import MasterConfig


@pytest.mark.parametrize("slot", [0, 1, 4097, SLOTS - 1])
def test_each_slot_is_a_30_of_the_benchmarking_range_of_its_own(slot):
    near, far = veth_pair(slot)
    link = ipaddress.IPv4Network(f"{near}/30", strict=False)
    assert link.subnet_of(VETH_RANGE) and ipaddress.IPv4Address(far) in link
    assert [str(a) for a in link.hosts()] == [near, far]
    assert int(link.network_address) == int(VETH_RANGE.network_address) + 4 * slot


def test_a_slot_outside_the_range_is_refused():
    for slot in (-1, SLOTS):
        with pytest.raises(ValueError, match="outside"):
            veth_pair(slot)


def test_the_masters_overlay_lists_the_lighthouse_as_the_master_reads_it():
    text = overlay_toml(LIGHTHOUSE_ADDRESS, "198.18.0.2:4242")
    config = msgspec.convert(tomllib.loads(text), MasterConfig)
    [lighthouse] = config.overlay.lighthouses
    assert (lighthouse.address, lighthouse.endpoints) == (LIGHTHOUSE_ADDRESS, ["198.18.0.2:4242"])


def test_a_missing_tool_is_named_with_the_package_that_brings_it(tmp_path):
    """Run where PATH has every tool but nebula (links to the real ones), as the demo's check is asked."""
    if os.geteuid() != 0:
        pytest.skip("as a user the check stops at root first (what the next test shows)")
    for tool in TOOLS:
        if tool != "nebula" and shutil.which(tool):
            (tmp_path / tool).symlink_to(shutil.which(tool))
    said = subprocess.run(
        [sys.executable, "-c", "from management.devgrid.lighthouse import lighthouse_unavailable as u; print(u())"],
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert said.startswith("nebula not installed") and "apt-get install nebula" in said, said


def test_a_demo_that_cannot_run_a_lighthouse_says_why_and_shows_no_gang_line(tmp_path):
    demo = Demo(tmp_path / "demo", api_port=None, agents=2)
    demo.no_overlay = "nebula not installed (Debian: apt-get install nebula ...)"

    line = demo.overlay_line()

    assert line.strip().startswith("overlay:") and "OFF: nebula not installed" in line and "--network none" in line
    assert not any(line.strip().startswith("gang:") for line in demo.renter_lines())
