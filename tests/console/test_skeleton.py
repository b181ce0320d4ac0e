"""The console's skeleton in a browser: signing in lands on the role's home with its navigation; signing out ends it."""

from __future__ import annotations


def test_each_role_signs_in_and_out(console_master, page, sign_in, shot):
    for role in ("renter", "provider", "operator"):
        account = sign_in(page, role)
        header = page.locator("header.top")
        assert account.id in header.inner_text() or account.name in header.inner_text()
        assert role in header.inner_text()
        shot(page, f"{role}-home")
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url("**/console/signin")
        page.goto(f"{console_master.url}/console/account")
        assert "/console/signin" in page.url  # signed out: pages ask to sign in again
