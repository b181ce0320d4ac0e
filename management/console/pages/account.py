"""The signed-in account's own page, for every role: its password, its API keys (create, shown once; list; revoke)
and its SSH public keys (add, list, delete: what logs in to its workloads, docs/ssh.md).

The keys are the account's own whatever its role: every call here passes the signed-in account as the owner, so even
the operator revokes only its own keys from this page (other accounts' keys are the operator's accounts pages). A key
of another account answers 404, as a missing one does (``AccountsService.revoke_api_key``). A new key is shown once,
in the answer to the POST that made it: never stored in the clear, never put in a cookie, a notice or a redirect.
"""

from __future__ import annotations

from aiohttp import web

from common.errors import Conflict, InvalidPassword
from management.access_control import Action, Resource, permitted
from management.console import session
from management.console.audit import record_write
from management.console.forms import FormErrors, text
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.keys import SERVICES_KEY
from management.services.ssh_keys import InvalidSshKey
from master.port import IssuedKey

KEY_NAME_MAX = 64  # as the API's key form takes it
KEYS_SHOWN = 1000  # an account holds at most a few dozen keys not revoked (MasterConfig.max_keys_per_account)


async def account_page(
    request: web.Request,
    *,
    error: str = "",
    status: int = 200,
    issued: IssuedKey | None = None,
    key_errors: FormErrors | None = None,
    key_name: str = "",
    ssh_errors: FormErrors | None = None,
    ssh_form: dict[str, str] | None = None,
) -> web.Response:
    scope = await session.signed_in(request, Resource.KEYS, Action.READ)
    own = scope.principal.account
    keys = await request.app[SERVICES_KEY].accounts.list_api_keys(own, owner=own, limit=KEYS_SHOWN)
    keeps_secrets = permitted(scope.principal.role, Resource.SECRETS, Action.READ)  # the link to its secrets page
    ssh_keys = await request.app[SERVICES_KEY].ssh_keys.list(owner=own)
    return await page(
        request, "account.html", title="Your account", error=error, status=status, keys=keys.items, issued=issued,
        key_errors=key_errors if key_errors is not None else FormErrors(), key_name=key_name, keeps_secrets=keeps_secrets,
        ssh_keys=ssh_keys, ssh_errors=ssh_errors if ssh_errors is not None else FormErrors(), ssh_form=ssh_form or {},
    )  # fmt: skip


async def change_password(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.PASSWORD, Action.WRITE)
    form = await request.post()
    new, again = str(form.get("password", "")), str(form.get("password_again", ""))
    if new != again:
        return await account_page(request, error="The two new passwords differ.", status=400)
    try:
        await request.app[SERVICES_KEY].accounts.set_password(
            scope.principal.account,
            new,
            owner=scope.owner,
            by=scope.principal.account,
            current_password=str(form.get("current_password", "")),
        )
    except InvalidPassword as exc:
        return await account_page(request, error=str(exc), status=400)
    await session.end(request)
    await session.flash(request, "Password changed: sign in with the new one (your other sessions ended too).")
    raise web.HTTPSeeOther("/console/signin")


async def create_key(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.KEYS, Action.WRITE)
    own = scope.principal.account
    name = text(await request.post(), "name", max_length=10 * KEY_NAME_MAX)
    errors = FormErrors()
    if not name:
        errors.add("key-name", "name: give the key a name that says where it is used (e.g. laptop, ci)")
    elif len(name) > KEY_NAME_MAX:
        errors.add("key-name", f"name: at most {KEY_NAME_MAX} characters, not {len(name)}")
    if errors:
        return await account_page(request, status=400, key_errors=errors, key_name=name[: KEY_NAME_MAX * 2])
    try:
        issued = await request.app[SERVICES_KEY].accounts.create_api_key(own, name, owner=own)
    except Conflict as exc:  # too many keys not revoked: said beside the form
        errors.add("key-name", str(exc))
        return await account_page(request, status=409, key_errors=errors, key_name=name)
    await record_write(request, scope, 200, issued.record.key_id)
    return await account_page(request, issued=issued)


async def revoke_key(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.KEYS, Action.WRITE)
    own = scope.principal.account
    key = await request.app[SERVICES_KEY].accounts.revoke_api_key(request.match_info["key_id"], owner=own)
    await record_write(request, scope, 303, key.key_id)
    await session.flash(request, f"API key {key.key_id} ({key.name}) is revoked: it is refused from now on.")
    raise web.HTTPSeeOther("/console/account")


async def add_ssh_key(request: web.Request) -> web.Response:
    """Register an SSH public key for the signed-in account (docs/ssh.md): its workloads let it in over SSH."""
    scope = await session.signed_in(request, Resource.SSH_KEYS, Action.WRITE)
    form = await request.post()
    typed = {"name": text(form, "ssh_name", max_length=200), "public_key": text(form, "public_key", max_length=16384)}
    errors = FormErrors()
    if not typed["public_key"]:
        errors.add("public_key", "public key: paste a public key (the one line of ~/.ssh/id_ed25519.pub)")
        return await account_page(request, status=400, ssh_errors=errors, ssh_form=typed)
    try:
        record = await request.app[SERVICES_KEY].ssh_keys.add(scope.principal.account, typed["public_key"], name=typed["name"])
    except InvalidSshKey as exc:
        errors.add("public_key", str(exc))
        return await account_page(request, status=400, ssh_errors=errors, ssh_form=typed)
    except Conflict as exc:  # that key already, or as many as an account may have
        errors.add("public_key", str(exc))
        return await account_page(request, status=409, ssh_errors=errors, ssh_form=typed)
    await session.flash(request, f"SSH key {record.name} ({record.fingerprint}) added: it may log in to your workloads.")
    raise web.HTTPSeeOther("/console/account#ssh-keys")


async def delete_ssh_key(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.SSH_KEYS, Action.WRITE)
    record = await request.app[SERVICES_KEY].ssh_keys.delete(request.match_info["key_id"], owner=scope.principal.account)
    await session.flash(request, f"SSH key {record.name} ({record.fingerprint}) deleted.")
    raise web.HTTPSeeOther("/console/account#ssh-keys")


NAV = [NavItem(role, "Account", "/console/account", order=1000) for role in ("operator", "provider", "renter")]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/account", account_page)
    router.add_post("/console/account/password", change_password)
    router.add_post("/console/account/keys", create_key)
    router.add_post("/console/account/keys/{key_id}/revoke", revoke_key)
    router.add_post("/console/account/ssh-keys", add_ssh_key)
    router.add_post("/console/account/ssh-keys/{key_id}/delete", delete_ssh_key)
