"""``idlegrid host price ...`` and ``idlegrid host drain/undrain`` against a real Master with its API (in a thread of
this process), through the CLI's own entry point: tables by default, ``--json`` for scripts."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from common.inventory import UnofferedGpu
from management.cli.hosts import duration_s
from tests.management.cli.test_accounts import idlegrid, served  # noqa: F401  # the served Master and the CLI runner
from tests.management.hosts import UNREACHABLE_DETAIL, UNREACHABLE_FIX, add_agent, api_key


def in_master(served, coro):  # noqa: F811
    return asyncio.run_coroutine_threadsafe(coro, served.loop).result(timeout=30)


@pytest.fixture
def acme(served) -> str:  # noqa: F811
    """Provider acme with two hosts; the value is its API key."""
    master = served.server.master
    in_master(served, add_agent(master, "agt-a1", "a10:1", provider="acme"))
    in_master(served, add_agent(master, "agt-a2", "a10:1", provider="acme"))
    header = in_master(served, api_key(master, "provider", "acme"))
    return header["Authorization"].removeprefix("Bearer ")


def test_a_provider_sets_shows_and_clears_a_hosts_price(idlegrid, acme):  # noqa: F811
    out = idlegrid(
        "host", "price", "set", "agt-a1", "--on-demand", "2.50", "--min-bid", "0.80", "--reserved-discount", "0.2",
        "--max-duration", "7d", "--api-key", acme,
    )  # fmt: skip
    header, row = out.splitlines()
    assert header.split()[:4] == ["HOST", "PROVIDER", "SOURCE", "ON"]
    assert row.split() == ["agt-a1", "acme", "host", "2.50", "0.80", "2.00", "20%", "7d", "USD"]
    shown = json.loads(idlegrid("host", "price", "show", "agt-a1", "--json", "--api-key", acme))
    assert (shown["source"], shown["on_demand"], shown["max_duration_s"]) == ("host", "2.50", 604800)
    cleared = idlegrid("host", "price", "clear", "agt-a1", "--api-key", acme)
    assert cleared.splitlines()[1].split()[:4] == ["agt-a1", "acme", "grid", "0.00"]


def test_a_providers_default_is_listed_with_its_hosts_own_prices(idlegrid, acme):  # noqa: F811
    idlegrid("host", "price", "default", "--on-demand", "1.2", "--api-key", acme)
    idlegrid("host", "price", "set", "agt-a2", "--on-demand", "3", "--api-key", acme)
    listed = idlegrid("host", "price", "show", "--api-key", acme)
    assert listed.splitlines()[0].startswith("grid default: 0.00 USD per GPU-hour")
    rows = [line.split()[:3] for line in listed.splitlines()[3:]]
    assert rows == [["acme", "(default)", "1.20"], ["acme", "agt-a2", "3.00"]]
    in_force = json.loads(idlegrid("host", "price", "show", "agt-a1", "--json", "--api-key", acme))
    assert (in_force["source"], in_force["on_demand"]) == ("provider", "1.20")
    everyone = json.loads(idlegrid("host", "price", "show", "--provider", "acme", "--json"))  # the operator
    assert len(everyone["items"]) == 2


def test_a_bad_price_is_one_line_naming_the_field(idlegrid, acme):  # noqa: F811
    err = idlegrid("host", "price", "set", "agt-a1", "--on-demand", "2,50", "--api-key", acme, ok=False)
    assert err.startswith("idlegrid host price set: 400 bad_request: on_demand:") and len(err.splitlines()) == 1
    err = idlegrid("host", "price", "default", "--on-demand", "1", ok=False)  # the operator names no provider
    assert "provider:" in err


def test_a_host_is_drained_and_undrained_from_the_command_line(idlegrid, acme):  # noqa: F811
    drained = idlegrid("host", "drain", "agt-a1", "--api-key", acme)
    assert drained.splitlines()[1].split() == ["agt-a1", "acme", "maintenance", "True"]
    undrained = json.loads(idlegrid("host", "undrain", "agt-a1", "--json", "--api-key", acme))
    assert (undrained["state"], undrained["drained"]) == ("ready", False)


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800.0), ("12h", 43200.0), ("90m", 5400.0), ("3600s", 3600.0)])
def test_a_max_duration_is_read_in_days_hours_minutes_or_seconds(text, seconds):
    assert duration_s(text) == seconds
    assert duration_s("none") is None
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration_s("a week")


def test_host_show_lists_the_gpus_and_why_one_that_did_not_reach_a_container_is_not_offered(idlegrid, served, acme):  # noqa: F811
    """Issue 23, acceptance 4 (the provider's view): the agent's self-test found a GPU not reaching a container."""
    master = served.server.master
    in_master(
        served, add_agent(master, "agt-a3", "a10:2", provider="acme", runtime="docker", isolation="container", unreachable=[1])
    )
    out = idlegrid("host", "show", "agt-a3", "--api-key", acme)
    first, second = (g for g in master.registry.gpus_of("agt-a3"))
    table_rows = [line.split(maxsplit=4) for line in out.splitlines() if line.startswith("GPU-") and "offered:" not in line]
    rows = {row[0]: row[1:] for row in table_rows}
    # the last column is the GPU's measured verification: a simulated card shows "simulated" (docs/verification.md)
    assert rows[first.uuid][1:3] == ["available", "yes"], out
    assert rows[first.uuid][3].split() == ["reaches", "a", "container", "simulated"], out
    assert rows[second.uuid][1:3] == ["offline", "no"], out
    assert rows[second.uuid][3].split() == ["DOES", "NOT", "REACH", "simulated"], out
    assert f"{second.uuid} is not offered: {UNREACHABLE_DETAIL}" in out and f"fix: {UNREACHABLE_FIX}" in out


def test_host_show_names_the_cards_the_host_has_and_does_not_offer(idlegrid, served, acme):  # noqa: F811
    """Issue 41, point 1 (the provider's view): a card on the bus that no library reads is shown with why and the fix."""
    missing = UnofferedGpu(
        pci_bus_id="0000:03:00.0",
        vendor="amd",
        device_id="0x744c",
        kind="no_driver",
        reason="no kernel driver is bound to it",
        fix="install AMD's amdgpu driver",
    )
    master = served.server.master
    in_master(
        served,
        add_agent(master, "agt-a4", "a10:1", provider="acme", runtime="docker", isolation="container", unoffered=[missing]),
    )
    out = idlegrid("host", "show", "agt-a4", "--api-key", acme)
    assert "amd card 0x744c at 0000:03:00.0 is not offered: no kernel driver is bound to it" in out, out
    assert "fix: install AMD's amdgpu driver" in out


def test_host_show_says_an_amd_hosts_partition_modes_are_reported_not_sold(idlegrid, served, acme):  # noqa: F811
    """Issue 41, point 2: an MI300X's partition modes are shown to its provider; an NVIDIA card has none to show."""
    master = served.server.master
    in_master(served, add_agent(master, "agt-a5", "mi300x:1", provider="acme", runtime="docker", isolation="container"))
    out = idlegrid("host", "show", "agt-a5", "--api-key", acme)
    [card] = master.registry.gpus_of("agt-a5")
    assert f"{card.uuid} partition modes: SPX, NPS1 (reported, not sold)" in out, out
    assert "partition modes" not in idlegrid("host", "show", "agt-a1", "--api-key", acme)
