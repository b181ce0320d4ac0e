"""API keys on every role's own account page, in Debian's Chromium against a real Master: a key is created and shown
once, works against the API as its account, is listed (never shown again) and revoked (the API refuses it from then
on); a bad name is said beside the field; and another account can neither see nor revoke it (404, as a missing key)."""

from __future__ import annotations

import re

import pytest

from master.records import AccountRecord

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def whoami(page, base_url: str, key: str) -> int:
    return page.request.get(f"{base_url}/api/v1/whoami", headers={"Authorization": f"Bearer {key}"}).status


@pytest.mark.parametrize("role", ["renter", "provider", "operator"])
def test_every_role_creates_a_key_shown_once_and_revokes_it(console_master, page, sign_in, shot, role):
    account = sign_in(page, role)
    page.get_by_role("link", name="Account", exact=True).click()
    page.wait_for_url(re.compile(r"/console/account$"))
    before = page.locator("#keys tbody tr:has(button)").count()  # the operator has its bootstrap key
    page.get_by_label("New key's name").fill("laptop")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    key = page.locator("#issued-key").inner_text().strip()
    assert len(key) >= 32 and "shown this once" in page.locator(".issued").inner_text()
    assert page.locator("#keys tbody tr:has(button)").count() == before + 1
    row = page.locator("#keys tbody tr", has_text="laptop").inner_text()
    assert key not in row  # the list names the key by its id, never by the secret
    shot(page, "key-created")
    response = page.request.get(f"{console_master.url}/api/v1/whoami", headers={"Authorization": f"Bearer {key}"})
    assert response.status == 200 and response.json()["account"] == account.id, response.text()

    page.goto(f"{console_master.url}/console/account")  # shown once: a later page has only its id
    assert page.locator("#issued-key").count() == 0 and key not in page.content()
    key_id = page.locator("#keys tbody tr", has_text="laptop").locator("th code").inner_text()
    page.get_by_role("button", name=f"Revoke key {key_id}", exact=False).click()
    page.wait_for_url(re.compile(r"/console/account$"))
    assert f"API key {key_id} (laptop) is revoked" in page.locator(".flashes").inner_text()
    assert page.get_by_role("button", name=f"Revoke key {key_id}", exact=False).count() == 0
    shot(page, "key-revoked")
    assert whoami(page, console_master.url, key) == 401


def test_a_key_without_a_name_or_with_a_long_one_is_refused_beside_the_field(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/account")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#key-name-error").inner_text().startswith("name: give the key a name")
    assert page.get_by_label("New key's name").get_attribute("aria-invalid") == "true"
    page.get_by_label("New key's name").evaluate("el => el.removeAttribute('maxlength')")
    page.get_by_label("New key's name").fill("x" * 65)
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "at most 64 characters, not 65" in page.locator("#key-name-error").inner_text()
    assert page.get_by_label("New key's name").input_value() == "x" * 65  # what was typed is kept
    assert "No API key yet" in page.locator("#keys").inner_text()
    shot(page, "key-name-errors")


def test_another_account_neither_sees_nor_revokes_your_keys(console_master, browser, page, sign_in, shot):
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/account")
    page.get_by_label("New key's name").fill("acme-ci")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    provider_key = page.locator("#issued-key").inner_text().strip()
    key_id = page.locator("#keys tbody th code").first.inner_text()

    other = browser.new_context(viewport={"width": 1280, "height": 860})
    renter = other.new_page()
    try:
        sign_in(renter, "renter")
        renter.goto(f"{console_master.url}/console/account")
        assert key_id not in renter.content() and "acme-ci" not in renter.content()
        # The renter posts the provider's key id with its own valid CSRF token, from the console's own origin.
        token = renter.locator('input[name="csrf_token"]').first.get_attribute("value")
        refused = renter.request.post(
            f"{console_master.url}/console/account/keys/{key_id}/revoke",
            form={"csrf_token": token},
            headers={"Origin": console_master.url},
            max_redirects=0,
        )
        assert refused.status == 404 and f"no API key &#39;{key_id}&#39;" in refused.text()
        # ...nor through the operator's revoke route: there too the renter's scope is its own keys.
        forbidden = renter.request.post(
            f"{console_master.url}/console/keys/{key_id}/revoke",
            form={"csrf_token": token},
            headers={"Origin": console_master.url},
            max_redirects=0,
        )
        assert forbidden.status == 404
        renter.goto(f"{console_master.url}/console/account/keys/{key_id}/revoke")  # a GET is no revocation
    finally:
        other.close()
    assert whoami(page, console_master.url, provider_key) == 200  # still works
    page.reload()
    assert page.get_by_role("button", name=f"Revoke key {key_id}", exact=False).count() == 1
    shot(page, "provider-key-untouched")


def test_console_key_writes_are_audit_events_naming_the_account(console_master, page, sign_in):
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/account")
    page.get_by_label("New key's name").fill("audit-me")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    key_id = page.locator("#keys tbody th code").first.inner_text()
    page.get_by_role("button", name=f"Revoke key {key_id}", exact=False).click()
    page.wait_for_url(re.compile(r"/console/account$"))
    events = console_master.run(console_master.server.master.events_after(subject="rita", kind_prefix="audit"))
    seen = [(e.data["method"], e.data["route"], e.data["target"]) for e in events]
    assert ("POST", "/console/account/keys", key_id) in seen
    assert ("POST", "/console/account/keys/{key_id}/revoke", key_id) in seen


def test_another_renter_neither_sees_nor_revokes_a_renters_keys(console_master, browser, page, sign_in, shot):
    async def second_renter() -> None:
        accounts = console_master.server.master.accounts
        await accounts.create(AccountRecord(id="zoe", role="renter", name="Zoe"))
        await accounts.set_password("zoe", "zoe-password-12")

    console_master.run(second_renter())
    sign_in(page, "renter")
    page.goto(f"{console_master.url}/console/account")
    page.get_by_label("New key's name").fill("rita-laptop")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    rita_key = page.locator("#issued-key").inner_text().strip()
    key_id = page.locator("#keys tbody th code").first.inner_text()

    other = browser.new_context(viewport={"width": 1280, "height": 860})
    zoe = other.new_page()
    try:
        zoe.goto(f"{console_master.url}/console/signin")
        zoe.get_by_label("Account").fill("zoe")
        zoe.get_by_label("Password").fill("zoe-password-12")
        zoe.get_by_role("button", name="Sign in").click()
        zoe.wait_for_url(lambda url: "/console/signin" not in url)
        zoe.goto(f"{console_master.url}/console/account")
        assert "No API key yet" in zoe.locator("#keys").inner_text()
        assert key_id not in zoe.content() and "rita-laptop" not in zoe.content()
        token = zoe.locator('input[name="csrf_token"]').first.get_attribute("value")
        refused = zoe.request.post(
            f"{console_master.url}/console/account/keys/{key_id}/revoke",
            form={"csrf_token": token},
            headers={"Origin": console_master.url},
            max_redirects=0,
        )
        assert refused.status == 404
        shot(zoe, "zoe-sees-only-her-own")
    finally:
        other.close()
    assert whoami(page, console_master.url, rita_key) == 200
