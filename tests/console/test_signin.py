"""Signing in to the console over HTTP: passwords, the session cookie, CSRF, sessions that end, the rate limit.

Runs the console as the Master serves it (management/app.py api_app) on aiohttp's test server; no browser needed."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest
from cryptography.fernet import Fernet

from common.errors import SignInRefused
from management.console.session import COOKIE_NAME, KEY_FILE, SECURE_COOKIE_NAME
from master.accounts import AccountChange
from master.config import ConsoleSettings
from master.records import AccountRecord
from tests.console.plain_http import CSRF, PASSWORD, console_for, csrf_of, sign_in


async def test_signing_in_sets_an_httponly_samesite_strict_cookie_and_goes_to_the_console(console):
    response = await sign_in(console)
    assert response.status == 303 and response.headers["Location"] == "/console/"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # served over plain http here; "auto" sets it over https
    assert "rita" not in cookie  # encrypted
    page = await console.get("/console/account")
    assert page.status == 200 and "Rita" in await page.text()
    signed = await console.master.store.events.list(subject="rita", kind_prefix="console.signin")
    assert [e.kind for e in signed] == ["console.signin"] and signed[0].data["address"] == "127.0.0.1"


async def test_over_https_the_cookie_is_the_host_prefixed_one_and_a_plain_one_is_never_read_only_cleared(tmp_path):
    """``cookie_secure = "always"`` (as behind a proxy that terminates TLS): ``__Host-idlegrid_console``, Secure, Path=/
    and no Domain, which nothing on another host can set or shadow. A plain ``idlegrid_console`` (an older session, or
    one a link on another port planted) signs nobody in there, and is cleared. The browser would not send a Secure
    cookie over this test's plain http, so the cookies are sent by hand."""
    console = await console_for(tmp_path, cookie_secure="always")
    try:
        anonymous = await console.get("/console/signin")
        csrf = CSRF.search(await anonymous.text())
        assert csrf is not None
        first = anonymous.cookies[SECURE_COOKIE_NAME].value
        form = {"account": "rita", "password": PASSWORD, "csrf_token": csrf.group(1), "next": "/console/"}
        headers = {"Origin": console.origin, "Cookie": f"{SECURE_COOKIE_NAME}={first}"}
        response = await console.post("/console/signin", data=form, headers=headers, allow_redirects=False)
        assert response.status == 303, await response.text()
        cookie = response.headers["Set-Cookie"]
        assert cookie.startswith(f"{SECURE_COOKIE_NAME}=") and "; Secure" in cookie and "Path=/;" in cookie
        assert "Domain" not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        session = response.cookies[SECURE_COOKIE_NAME].value
        console.session.cookie_jar.clear()

        page = await console.get("/console/account", headers={"Cookie": f"{SECURE_COOKIE_NAME}={session}"})
        assert page.status == 200 and "Rita" in await page.text()
        plain = await console.get("/console/account", headers={"Cookie": f"{COOKIE_NAME}={session}"}, allow_redirects=False)
        assert plain.status == 303 and plain.headers["Location"].startswith("/console/signin")  # not signed in by it
        [cleared] = [v for v in plain.headers.getall("Set-Cookie") if v.startswith(f"{COOKIE_NAME}=")]
        assert "Max-Age=0" in cleared and "Path=/console" in cleared
    finally:
        await console.close()
        await console.master.stop()


async def test_a_console_cookie_that_comes_twice_signs_nobody_in(console):
    """Beside the console's HttpOnly cookie, a link's script on another port of the host can add only a cookie of the
    same name scoped to a longer path (the browser then sends both, the longer first): the console trusts neither."""
    await console.master.accounts.create(AccountRecord(id="bob", role="renter", name="Bob"))
    await console.master.accounts.set_password("bob", "bob-password-1")
    await sign_in(console, "bob", "bob-password-1")
    bobs = console.session.cookie_jar.filter_cookies(console.make_url("/console/"))[COOKIE_NAME].value
    console.session.cookie_jar.clear()
    await sign_in(console)
    ritas = console.session.cookie_jar.filter_cookies(console.make_url("/console/"))[COOKIE_NAME].value
    console.session.cookie_jar.clear()

    alone = await console.get("/console/account", headers={"Cookie": f"{COOKIE_NAME}={ritas}"})
    assert alone.status == 200 and "Rita" in await alone.text()
    both = f"{COOKIE_NAME}={bobs}; {COOKIE_NAME}={ritas}"
    shadowed = await console.get("/console/account", headers={"Cookie": both}, allow_redirects=False)
    assert shadowed.status == 303 and shadowed.headers["Location"].startswith("/console/signin")  # neither Bob nor Rita


@pytest.mark.parametrize(("account", "password"), [("rita", "wrong-password-1"), ("nobody", PASSWORD), ("Not An Id!", PASSWORD)])
async def test_a_wrong_password_and_an_unknown_account_get_the_same_answer(console, account, password):
    response = await sign_in(console, account, password)
    assert response.status == 401
    assert "wrong account or password" in await response.text()
    assert (await console.get("/console/account", allow_redirects=False)).status == 303  # still signed out
    refused = await console.master.store.events.list(kind_prefix="console.signin_refused")
    assert [e.subject for e in refused] == [account]


async def test_an_unknown_account_takes_as_long_to_refuse_as_a_wrong_password(console):
    async def fastest(account: str) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            with pytest.raises(SignInRefused):
                await console.master.accounts.sign_in(account, "wrong-password-1")
            times.append(time.perf_counter() - started)
        return min(times)

    # Behaviour, not speed: a ratio of two timings on the same machine, so an unknown account cannot be told from a
    # wrong password by how fast it is refused (both pay the password hash); no absolute figure is asserted.
    wrong, unknown = await fastest("rita"), await fastest("nobody")
    assert unknown > wrong / 2, f"unknown account refused in {unknown:.4f} s, a wrong password in {wrong:.4f} s"


async def test_a_disabled_account_cannot_sign_in_and_its_sessions_end(console):
    assert (await sign_in(console)).status == 303
    await console.master.accounts.update("rita", AccountChange(disabled=True))
    ended = await console.get("/console/account", allow_redirects=False)
    assert ended.status == 303 and ended.headers["Location"].startswith("/console/signin")
    refused = await sign_in(console)
    assert refused.status == 401 and "disabled" in await refused.text()


async def test_changing_the_password_ends_the_accounts_sessions(console):
    assert (await sign_in(console)).status == 303
    assert (await console.get("/console/account", allow_redirects=False)).status == 200
    await console.master.accounts.set_password("rita", "a-new-password-2")
    ended = await console.get("/console/account")  # follows to the sign-in page
    assert ended.url.path == "/console/signin" and "your password was changed" in await ended.text()
    assert (await sign_in(console)).status == 401
    assert (await sign_in(console, password="a-new-password-2")).status == 303


async def test_the_console_changes_its_own_password_and_signs_out(console):
    await sign_in(console)
    token = await csrf_of(console, "/console/account")
    form = {"csrf_token": token, "current_password": PASSWORD, "password": "a-new-password-2", "password_again": "x"}
    differ = await console.post("/console/account/password", data=form, headers={"Origin": console.origin})
    assert differ.status == 400 and "differ" in await differ.text()
    form["password_again"] = form["password"]
    changed = await console.post("/console/account/password", data=form, headers={"Origin": console.origin})
    assert changed.url.path == "/console/signin" and "Password changed" in await changed.text()
    assert (await console.master.accounts.get("rita")).password_epoch == 2


@pytest.mark.parametrize("token", [None, "not-the-token"])
async def test_a_post_without_the_right_csrf_token_is_refused_403(console, token):
    await sign_in(console)
    form = {"csrf_token": token} if token else {}
    response = await console.post("/console/signout", data=form, headers={"Origin": console.origin})
    assert response.status == 403 and "CSRF" in await response.text()
    assert (await console.get("/console/account", allow_redirects=False)).status == 200  # still signed in


async def test_a_post_from_another_origin_is_refused_even_with_the_token(console):
    form = {"account": "rita", "password": PASSWORD, "csrf_token": await csrf_of(console)}
    other = await console.post("/console/signin", data=form, headers={"Origin": "http://evil.example"}, allow_redirects=False)
    assert other.status == 403
    none = await console.post("/console/signin", data=form, allow_redirects=False)  # neither Origin nor Referer
    assert none.status == 403


async def test_sign_in_attempts_are_rate_limited_per_account_and_per_address(tmp_path):
    console = await console_for(tmp_path, signin_burst=3, signin_per_minute=1.0)
    try:
        for _ in range(3):
            assert (await sign_in(console, password="wrong-password-1")).status == 401
        limited = await sign_in(console)  # the right password, but the account's attempts are spent
        assert limited.status == 429 and int(limited.headers["Retry-After"]) >= 1
        assert "Too many sign-in attempts" in await limited.text()
        other_account = await sign_in(console, account="someone-else")  # this address's attempts are spent too
        assert other_account.status == 429
    finally:
        await console.close()
        await console.master.stop()


async def sign_in_from(console, source: str, password: str = PASSWORD) -> int:
    """The sign-in form, as a browser on another address would send it: a client bound to ``source`` (another
    loopback address) connecting to the console on 127.0.0.1. The status of the form's answer."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        page = await (await browser.get(console.make_url("/console/signin"))).text()
        found = CSRF.search(page)
        assert found, "the sign-in page has no CSRF field"
        form = {"account": "rita", "password": password, "csrf_token": found.group(1), "next": "/console/"}
        answer = await browser.post(
            console.make_url("/console/signin"), data=form, headers={"Origin": console.origin}, allow_redirects=False
        )
        return answer.status


async def test_wrong_passwords_from_one_address_do_not_lock_the_account_out_from_another(tmp_path):
    console = await console_for(tmp_path, signin_burst=3, signin_per_minute=1.0)
    try:
        for _ in range(5):
            assert (await sign_in(console, password="wrong-password-1")).status in (401, 429)
        assert (await sign_in(console)).status == 429  # the attacker's address is throttled for this account
        assert await sign_in_from(console, "127.0.0.2") == 303  # the owner, from a fresh address, is let in
    finally:
        await console.close()
        await console.master.stop()


async def test_a_session_cookie_is_no_key_to_the_api(console):
    await sign_in(console)
    response = await console.get("/api/v1/whoami")
    assert response.status == 401


async def test_after_signing_in_only_a_console_path_is_followed(console):
    response = await sign_in(console, next="//evil.example/console/")
    assert response.headers["Location"] == "/console/"


async def test_console_pages_carry_security_headers(console):
    response = await console.get("/console/signin")
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert (await console.get("/", allow_redirects=False)).headers["Location"] == "/console/"


async def test_a_page_of_another_role_is_refused_with_a_page_saying_why(console):
    await console.master.accounts.create(AccountRecord(id="acme", role="provider"))
    await console.master.accounts.set_password("acme", "provider-password-1")
    assert (await sign_in(console, "acme", "provider-password-1")).status == 303
    response = await console.get("/console/launch")
    assert response.status == 403 and response.content_type == "text/html"
    assert "a provider key may not write workloads" in await response.text()


async def test_a_session_older_than_its_lifetime_ends_however_it_is_used(console):
    """The sign-in time inside the cookie is what counts: aged by hand (with the Master's own cookie key, from its state
    dir), the same session is signed out."""
    await sign_in(console)
    fernet = Fernet((console.master.config.state_path / KEY_FILE).read_bytes().strip())
    cookie = console.session.cookie_jar.filter_cookies(console.make_url("/console/"))[COOKIE_NAME].value
    content = json.loads(fernet.decrypt(cookie.encode()))
    assert (await console.get("/console/account", allow_redirects=False)).status == 200
    content["session"]["since"] -= ConsoleSettings().session_lifetime_s + 60
    aged = fernet.encrypt(json.dumps(content).encode()).decode()
    console.session.cookie_jar.clear()
    response = await console.get("/console/account", headers={"Cookie": f"{COOKIE_NAME}={aged}"}, allow_redirects=False)
    assert response.status == 303 and response.headers["Location"].startswith("/console/signin")
