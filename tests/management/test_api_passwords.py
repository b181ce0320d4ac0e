"""PUT /api/v1/accounts/{id}/password: the operator sets anyone's console password, an account its own (with the
current one once it has one); the hash never leaves the Master; every change is an event."""

from __future__ import annotations

import msgspec

from master.passwords import password_matches
from tests.management.test_api_accounts import create, error_of, new_key

PASSWORD = "correct-horse-battery"


async def put_password(api, account: str, body: dict, headers=None):
    return await api.put(f"/api/v1/accounts/{account}/password", json=body, headers=headers or api.auth)


async def test_the_operator_sets_a_password_that_is_stored_hashed_and_never_shown(api):
    await create(api, {"id": "rita", "role": "renter"})
    response = await put_password(api, "rita", {"password": PASSWORD})
    assert response.status == 200
    text = await response.text()
    assert "password" not in text and "argon2" not in text
    stored = await api.master.accounts.get("rita")
    assert stored.password_hash.startswith("$argon2id$") and PASSWORD not in stored.password_hash
    assert password_matches(stored.password_hash, PASSWORD) and stored.password_epoch == 1
    for path in ("/api/v1/accounts/rita", "/api/v1/accounts"):
        shown = await (await api.get(path, headers=api.auth)).text()
        assert "password" not in shown and "argon2" not in shown
    events = await api.master.store.events.list(subject="rita", kind_prefix="account.password_set")
    assert [e.data["by"] for e in events] == ["operator"]


async def test_an_account_sets_its_own_first_password_then_needs_the_current_one(api):
    await create(api, {"id": "rita", "role": "renter"})
    _, rita = await new_key(api, "rita")
    assert (await put_password(api, "rita", {"password": PASSWORD}, rita)).status == 200
    missing = await error_of(await put_password(api, "rita", {"password": "another-one-here"}, rita))
    assert missing[:2] == (400, "bad_request") and "current_password" in missing[2]
    wrong = await error_of(await put_password(api, "rita", {"password": "another-one-here", "current_password": "nope"}, rita))
    assert wrong[:2] == (400, "bad_request") and "current_password: does not match" in wrong[2]
    changed = await put_password(api, "rita", {"password": "another-one-here", "current_password": PASSWORD}, rita)
    assert changed.status == 200
    assert (await api.master.accounts.get("rita")).password_epoch == 2


async def test_another_accounts_password_answers_404_and_is_left_alone(api):
    await create(api, {"id": "rita", "role": "renter"})
    await create(api, {"id": "acme", "role": "provider"})
    _, acme = await new_key(api, "acme")
    status, code, _ = await error_of(await put_password(api, "rita", {"password": PASSWORD}, acme))
    assert (status, code) == (404, "not_found")
    assert (await api.master.accounts.get("rita")).password_hash == ""


async def test_bad_passwords_are_refused_naming_the_field(api):
    await create(api, {"id": "rita", "role": "renter"})
    short = await error_of(await put_password(api, "rita", {"password": "eleven-char"}))
    assert short == (400, "bad_request", "password: at least 12 characters, got 11")
    spaces = await error_of(await put_password(api, "rita", {"password": " " * 12}))
    assert spaces[0] == 400 and "password: must not be only spaces" in spaces[2]
    long = await error_of(await put_password(api, "rita", {"password": "x" * 1025}))
    assert long[0] == 400 and "password: at most 1024 characters" in long[2]
    unknown = await error_of(await put_password(api, "rita", {"password": PASSWORD, "hash": "x"}))
    assert unknown[0] == 400 and "hash" in unknown[2]
    missing = await error_of(await put_password(api, "nobody", {"password": PASSWORD}))
    assert missing[:2] == (404, "not_found")
    assert msgspec.json.decode(await (await api.get("/api/v1/accounts/rita", headers=api.auth)).read())["id"] == "rita"
