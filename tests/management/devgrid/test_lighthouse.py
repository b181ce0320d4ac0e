"""The lighthouse's pure parts (management/devgrid/lighthouse.py): where each slot's veth lies and the Master's
``[overlay]`` that lists it. Its namespace and nebula run in tests/e2e/test_demo_gang.py and test_gang_resume.py."""

from __future__ import annotations

import ipaddress
import tomllib

import msgspec
import pytest

from management.devgrid.lighthouse import LIGHTHOUSE_ADDRESS, SLOTS, VETH_RANGE, overlay_toml, veth_pair
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
