"""The provider's "Add a host" page in a browser, on a real Master (in-process): a fresh join token bound to the
signed-in provider, and a ready command for Docker, Podman and no container engine, each fetching this Master's
install.sh; a renter may not make one (that the command enrolls a host: tests/e2e/test_onboarding.py). And the host page
shows the agent's GPU self-test: a GPU that did not reach a container, why, and the fix."""

from __future__ import annotations

import re
import time

from common.inventory import GpuPartition, UnofferedGpu
from master.enrollment import hash_secret
from master.store.base import TokenOutcome
from tests.management.hosts import UNREACHABLE_DETAIL, UNREACHABLE_FIX, add_agent


def token_in(command: str) -> str:
    found = re.search(r"--token (igjt_\S+)", command)
    assert found is not None, command
    return found.group(1)


def test_a_provider_gets_a_token_of_its_own_and_a_command_for_each_engine(console_master, page, sign_in, shot):
    sign_in(page, "provider")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Add a host").click()
    page.wait_for_url(re.compile(r"/console/add-host$"))
    assert "No relay is linked" in page.locator("main").inner_text()  # this Master has no relay: said, not hidden
    shot(page, "add-a-host")

    page.get_by_role("button", name="Make a join token and the commands").click()
    page.wait_for_load_state()  # the page the click brings, whole
    commands = {engine: page.locator(f"#command-{engine}").inner_text() for engine in ("docker", "podman", "none")}
    shot(page, "commands")
    tokens = {token_in(command) for command in commands.values()}
    assert len(tokens) == 1, commands  # one token, in each command
    for engine, command in commands.items():
        assert command.startswith(f"curl -fsSL {console_master.url}/install.sh | sudo sh -s -- --token igjt_")
        assert command.endswith(f"--engine {engine}")

    # Bound to the signed-in provider: enrolling with it would make acme's host (spent here straight in the store).
    outcome, record = console_master.run(
        console_master.server.master.store.tokens.consume(hash_secret(tokens.pop()), agent_id="agt-x", now=time.time())
    )
    assert outcome is TokenOutcome.OK and record is not None and record.provider == "acme"


def test_a_renter_may_not_add_a_host_and_the_operators_tokens_page_names_no_made_up_command(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    response = page.goto(f"{console_master.url}/console/add-host")
    assert response.status == 403
    page.context.clear_cookies()
    sign_in(page, "operator")
    page.goto(f"{console_master.url}/console/tokens")
    text = page.locator("main").inner_text()
    assert "--join" not in text and "idlegrid-agent" not in text
    assert f"curl -fsSL {console_master.url}/install.sh | sudo sh -s -- --token TOKEN" in text
    shot(page, "operator-tokens")


def test_a_host_page_says_which_gpu_did_not_reach_a_container_why_and_the_fix(console_master, page, sign_in, shot):
    """Issue 23, acceptance 4 (the console): the agent's self-test found GPU 1 not reaching a container."""
    master = console_master.server.master
    console_master.run(
        add_agent(master, "agt-acme-s", "a10:2", provider="acme", runtime="docker", isolation="container", unreachable=[1])
    )
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-s")
    cells = page.locator("table[aria-labelledby=gpus-heading] tbody td.selftest")
    assert cells.all_inner_texts() == ["reaches a container", "does not reach"]
    warning = page.locator("#selftest-1")
    text = warning.inner_text()
    assert "GPU 1 is not offered" in text and UNREACHABLE_DETAIL in text and f"Fix: {UNREACHABLE_FIX}" in text
    assert page.locator("#selftest-0").count() == 0
    shot(page, "host-selftest")


def test_a_host_page_names_the_cards_the_host_does_not_offer_why_and_the_fix(console_master, page, sign_in, shot):
    """Issue 41, point 1 (the console): a card seen on the host's bus that no binding reads is shown, never omitted."""
    master = console_master.server.master
    missing = UnofferedGpu(
        pci_bus_id="0000:03:00.0",
        vendor="amd",
        device_id="0x744c",
        kind="no_driver",
        reason="no kernel driver is bound to it",
        fix="install AMD's amdgpu driver (ROCm's amdgpu-dkms package) and reboot",
    )
    console_master.run(
        add_agent(master, "agt-acme-u", "a10:1", provider="acme", runtime="docker", isolation="container", unoffered=[missing])
    )
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-u")
    rows = page.locator("table[aria-labelledby=unoffered-heading] tbody tr")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "0000:03:00.0" in text and "no kernel driver is bound to it" in text and "amdgpu-dkms" in text
    shot(page, "host-unoffered")


def test_the_host_page_shows_amd_partition_modes_and_a_split_card_not_sold(console_master, page, sign_in, shot):
    """Issue 41: an MI300X host's cards show their partition modes (whole, SPX: sold as one GPU); a card split into
    CPX partitions is listed among the cards not offered, with its modes and the way back to SPX."""
    master = console_master.server.master
    cpx = GpuPartition(compute="CPX", memory="NPS4", compute_modes=("SPX", "DPX", "QPX", "CPX"), memory_modes=("NPS1", "NPS4"))
    split = UnofferedGpu(
        pci_bus_id="0000:26:00.0",
        vendor="amd",
        name="AMD Instinct MI300X",
        kind="partitioned",
        reason=f"its compute is split into several devices ({cpx.describe()}): partitions are not sold yet",
        fix="to offer it whole: sudo amd-smi set --gpu all --compute-partition SPX",
        partition=cpx,
    )
    console_master.run(
        add_agent(master, "agt-acme-amd", "mi300x:1", provider="acme", runtime="docker", isolation="container", unoffered=[split])
    )
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-amd")
    gpus = page.locator("table[aria-labelledby=gpus-heading]")
    assert "Partitions" in gpus.locator("thead").inner_text()
    assert gpus.locator("td.partition").first.inner_text() == "SPX, NPS1 (can be SPX, DPX, QPX, CPX; NPS1, NPS4)"
    unoffered = page.locator("table[aria-labelledby=unoffered-heading] tbody tr").first.inner_text()
    assert "CPX, NPS4" in unoffered and "--compute-partition SPX" in unoffered
    shot(page, "host-amd-partitions")

    console_master.run(add_agent(master, "agt-acme-nv", "a10:1", provider="acme", runtime="docker", isolation="container"))
    page.goto(f"{console_master.url}/console/hosts/agt-acme-nv")  # an NVIDIA host: no partitions column at all
    assert "Partitions" not in page.locator("table[aria-labelledby=gpus-heading] thead").inner_text()
