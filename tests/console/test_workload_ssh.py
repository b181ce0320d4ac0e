"""A workload's page says how to reach it over SSH (the CLI's ``idlegrid ssh-config ID`` line) and which of the
account's SSH keys may log in, or how to add one; the account page adds, lists and deletes SSH keys. In Debian's
Chromium against a real Master (the workload is only submitted: no host runs it, and no SSH session is opened here;
tests/e2e has those)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from master.port import WorkloadSpec
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def public_key(comment: str) -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}"


@pytest.fixture
def submitted(console_master):
    master, services = console_master.server.master, console_master.services

    async def seed() -> str:
        await add_agent(master, "agt-a10", "a10:2", provider="acme", runtime="docker", isolation="container")
        return (await services.workloads.submit_workload("rita", WorkloadSpec(name="ssh-me", image="python:3.12"))).id

    console_master.workload_id = console_master.run(seed())
    return console_master


def test_the_workload_page_gives_the_ssh_config_line_and_the_keys_that_may_log_in(submitted, page, sign_in, shot):
    workload = submitted.workload_id
    sign_in(page, "renter")
    page.goto(f"{submitted.url}/console/workloads/{workload}")
    section = page.locator("section#ssh")
    assert section.locator("#ssh-config").inner_text() == f"idlegrid ssh-config {workload} >> ~/.ssh/config"
    assert "You have no SSH key yet" in section.inner_text()
    shot(page, "ssh-without-a-key")
    section.get_by_role("link", name="add your public key on your account page").click()
    page.wait_for_url("**/console/account#ssh-keys")

    page.get_by_label("Public key", exact=False).fill("ssh-ed25519 not-base64!")
    page.get_by_role("button", name="Add the SSH key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "public_key: not a valid ssh-ed25519 key" in page.locator("#public_key-error").inner_text()
    assert page.get_by_label("Public key", exact=False).input_value() == "ssh-ed25519 not-base64!"
    shot(page, "a-bad-key-said-beside-its-field")

    page.get_by_label("Public key", exact=False).fill(public_key("rita@laptop"))
    page.get_by_role("button", name="Add the SSH key").click()
    [stored] = submitted.run(submitted.services.ssh_keys.list(owner="rita"))
    listed = page.locator("#ssh-key-list tbody").inner_text()
    assert "rita@laptop" in listed and stored.fingerprint in listed
    shot(page, "key-added")

    page.goto(f"{submitted.url}/console/workloads/{workload}")
    keys = page.locator("section#ssh #ssh-keys").inner_text()
    assert "rita@laptop" in keys and stored.fingerprint in keys
    shot(page, "ssh-with-a-key")

    page.goto(f"{submitted.url}/console/account")
    page.get_by_role("button", name="Delete SSH key rita@laptop").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "No SSH key yet." in page.locator("#ssh-key-list").inner_text()
    assert submitted.run(submitted.services.ssh_keys.list(owner="rita")) == []
