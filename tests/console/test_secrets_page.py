"""The secrets page over plain HTTP (the console as the Master serves it; no browser): a value never comes back, not
even on a form with an error; each account sees and deletes only its own; a role without secrets gets 403.

The pages in Chromium, with screenshots: tests/console/test_storage_pages.py."""

from __future__ import annotations

import html

import pytest

from master.records import AccountRecord
from tests.console.plain_http import Console, csrf_of, sign_in

VALUE = "AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


async def _post(console: Console, path: str, **form: str):
    form = {"csrf_token": await csrf_of(console, "/console/secrets"), **form}
    return await console.post(path, data=form, headers={"Origin": console.origin}, allow_redirects=False)


async def _account(console: Console, account: str, role: str = "renter") -> None:
    await console.master.accounts.create(AccountRecord(id=account, role=role))
    await console.master.accounts.set_password(account, f"{account}-password-1")


async def test_a_stored_secret_is_listed_by_name_and_its_value_is_never_shown(console):
    await sign_in(console)
    created = await _post(console, "/console/secrets", name="datasets-rw", value=VALUE + "\r\n")
    assert created.status == 303 and created.headers["Location"] == "/console/secrets"
    listed = await console.get("/console/secrets")
    body = await listed.text()
    assert listed.status == 200 and "datasets-rw" in body and f"{len(VALUE)} bytes" in body  # the browser's CRLF dropped
    assert "Its value is never shown again" in body  # the notice after the redirect
    assert "wJalrXUtnFEMI" not in body and "AKIAEXAMPLE" not in body
    stored = await console.master.secrets.resolve("rita", ["datasets-rw"])
    assert stored == {"datasets-rw": VALUE}


@pytest.mark.parametrize(
    ("name", "value", "field", "says"),
    [
        ("", VALUE, "name", "give the secret a name"),
        ("-bad name", VALUE, "name", "starting with a letter or digit"),
        ("x" * 64, VALUE, "name", "1 to 63 letters"),
        ("token", "", "value", "value is empty"),
        ("token", "x" * (64 * 1024 + 1), "value", "more than 65536"),
    ],
)
async def test_a_bad_name_or_value_is_said_beside_its_field_and_the_value_is_not_sent_back(console, name, value, field, says):
    await sign_in(console)
    answer = await _post(console, "/console/secrets", name=name, value=value)
    body = html.unescape(await answer.text())
    assert answer.status == 400
    assert f'id="{field}-error"' in body and says in body, body
    assert 'aria-invalid="true"' in body
    if value:
        assert value[:40] not in body  # never echoed back, even to the one who typed it
    assert await console.master.secrets.list("rita") == []


async def test_a_duplicate_name_is_refused_beside_the_name_and_the_first_value_stays(console):
    await sign_in(console)
    await _post(console, "/console/secrets", name="datasets-rw", value=VALUE)
    again = await _post(console, "/console/secrets", name="datasets-rw", value="other:value")
    body = html.unescape(await again.text())
    assert again.status == 400 and "you already have a secret named 'datasets-rw'" in body and 'id="name-error"' in body
    assert await console.master.secrets.resolve("rita", ["datasets-rw"]) == {"datasets-rw": VALUE}


async def test_deleting_asks_first_then_deletes(console):
    await sign_in(console)
    await _post(console, "/console/secrets", name="datasets-rw", value=VALUE)
    confirm = await console.get("/console/secrets/datasets-rw/delete")
    body = await confirm.text()
    assert confirm.status == 200 and "Delete secret" in body and "can no longer" in body
    assert [s.name for s in await console.master.secrets.list("rita")] == ["datasets-rw"]  # asking deletes nothing
    deleted = await _post(console, "/console/secrets/datasets-rw/delete")
    assert deleted.status == 303
    assert await console.master.secrets.list("rita") == []
    assert "Deleted secret datasets-rw" in await (await console.get("/console/secrets")).text()


async def test_another_account_neither_sees_nor_deletes_a_renters_secrets(console):
    await sign_in(console)
    await _post(console, "/console/secrets", name="datasets-rw", value=VALUE)
    await _account(console, "zoe")
    assert (await sign_in(console, "zoe", "zoe-password-1")).status == 303
    theirs = await (await console.get("/console/secrets")).text()
    assert "datasets-rw" not in theirs and "No secrets yet" in theirs
    assert (await console.get("/console/secrets/datasets-rw/delete")).status == 404
    refused = await _post(console, "/console/secrets/datasets-rw/delete")
    assert refused.status == 404 and "no secret named 'datasets-rw'" in html.unescape(await refused.text())
    # zoe's own secret of the same name is hers alone; rita's value is untouched
    assert (await _post(console, "/console/secrets", name="datasets-rw", value="zoe:zoes-own")).status == 303
    assert await console.master.secrets.resolve("rita", ["datasets-rw"]) == {"datasets-rw": VALUE}
    assert await console.master.secrets.resolve("zoe", ["datasets-rw"]) == {"datasets-rw": "zoe:zoes-own"}


async def test_the_operator_sees_only_its_own_secrets_and_a_provider_none(console):
    await sign_in(console)
    await _post(console, "/console/secrets", name="datasets-rw", value=VALUE)
    await _account(console, "ops", role="operator")
    await sign_in(console, "ops", "ops-password-1")
    page = await (await console.get("/console/secrets")).text()
    assert "datasets-rw" not in page and "No secrets yet" in page
    assert (await console.get("/console/secrets/datasets-rw/delete")).status == 404
    assert "/console/secrets" in await (await console.get("/console/account")).text()  # linked from its account
    await _account(console, "acme", role="provider")
    await sign_in(console, "acme", "acme-password-1")
    assert (await console.get("/console/secrets")).status == 403
    assert "/console/secrets" not in await (await console.get("/console/account")).text()
