"""Storage in the renter's console, in Debian's Chromium against a real Master (docs/console-pages.md, "Secrets and
storage"): the secrets page (store, errors beside the fields, delete after a confirmation), the launch form's storage
block (the spec it submits is the one ``idlegrid workload submit --input/--output/--checkpoint`` builds; bad input
said beside its field) and the checkpoint's state on a workload's page.

The hosts are simulated (no GPU here, and no agent runs behind them); the storage events a workload's page reads are
recorded as the Master records a host's reports (master/agent_channel.py ``_on_storage``); the agent's transfers
themselves are tested on a real grid with a real S3 server in tests/e2e/test_storage.py."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEYS = "AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def store_secret(page, name: str, value: str) -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Value", exact=True).fill(value)
    page.get_by_role("button", name="Store secret").click()


def test_secrets_are_stored_listed_by_name_and_deleted_after_a_confirmation(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Account").click()
    page.locator("#secrets-link").get_by_role("link", name="your secrets").click()
    assert page.url.endswith("/console/secrets") and "No secrets yet" in page.locator("main").inner_text()
    store_secret(page, "datasets-rw", KEYS)
    page.wait_for_url(re.compile(r"/console/secrets$"))
    assert "Its value is never shown again" in page.locator(".flashes").inner_text()
    assert "datasets-rw" in page.locator("#secrets").inner_text()
    assert "wJalr" not in page.content()
    shot(page, "stored")
    store_secret(page, "datasets-rw", "other:value")  # taken
    assert "you already have a secret named 'datasets-rw'" in page.locator("#name-error").inner_text()
    assert page.get_by_label("Name", exact=True).get_attribute("aria-invalid") == "true"
    assert page.get_by_label("Value", exact=True).input_value() == ""  # never sent back
    shot(page, "duplicate")
    store_secret(page, "bad name!", "x")
    assert "starting with a letter or digit" in page.locator("#name-error").inner_text()
    shot(page, "bad-name")
    page.get_by_role("link", name="Delete secret datasets-rw").click()
    assert "can no longer" in page.locator("main").inner_text()
    shot(page, "confirm-delete")
    page.get_by_role("button", name="Delete datasets-rw").click()
    page.wait_for_url(re.compile(r"/console/secrets$"))
    assert "Deleted secret datasets-rw" in page.locator(".flashes").inner_text()
    assert "No secrets yet" in page.locator("main").inner_text()
