"""An account's secrets (docs/storage.md): listed by name, created (the value is taken once and never shown again, not
even on a form that comes back with an error), deleted after a confirmation page.

Every call names the signed-in account's own id: the secrets service acts on that account's secrets alone, so another
account's secret is simply not there (its name answers 404). Roles without secrets (providers) get 403.
"""

from __future__ import annotations

import re

from aiohttp import web

from common.errors import Conflict, NotFound
from management.access_control import Action, Resource
from management.console import session
from management.console.forms import FormErrors, FormFields, text
from management.console.nav import NavItem
from management.console.rendering import page
from management.http.keys import SERVICES_KEY
from master.port import SECRET_NAME_PATTERN, InvalidSecret

SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
MAX_NAME_TYPED = 200  # longer than any name the vault takes: what is typed is kept whole enough to be told it is long
NAME_RULE = "1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"


def read_secret_form(form: FormFields, errors: FormErrors) -> tuple[str, str]:
    """(name, value) from the create form, each problem beside its field. The value is kept as typed (a browser sends
    a textarea's line ends as CRLF: they are made LF, and one trailing line end dropped, as the CLI drops echo's)."""
    name = text(form, "name", max_length=MAX_NAME_TYPED)
    if not name:
        errors.add("name", "name: give the secret a name, e.g. s3-keys")
    elif not SECRET_NAME.match(name):
        errors.add("name", f"name {name[:70]!r}: use {NAME_RULE}")
    raw = form.get("value", "")
    value = raw.replace("\r\n", "\n").removesuffix("\n") if isinstance(raw, str) else ""
    if not value:
        errors.add("value", "value: the secret's value is empty")
    return name, value


async def _secrets_page(request: web.Request, account: str, *, name: str = "", errors: FormErrors | None = None) -> web.Response:
    items = await request.app[SERVICES_KEY].secrets.list(account)
    errors = errors if errors is not None else FormErrors()
    return await page(
        request, "secrets/secrets.html", status=400 if errors else 200, title="Secrets", items=items, name=name,
        errors=errors, name_rule=NAME_RULE,
    )  # fmt: skip


async def secrets_page(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.SECRETS, Action.READ)
    return await _secrets_page(request, scope.principal.account)


async def create_secret(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.SECRETS, Action.WRITE)
    account = scope.principal.account  # always one's own: the operator's too
    errors = FormErrors()
    name, value = read_secret_form(await request.post(), errors)
    if not errors:
        try:
            await request.app[SERVICES_KEY].secrets.create(account, name, value)
        except Conflict:  # the name is taken (secrets are never overwritten in place)
            errors.add("name", f"name: you already have a secret named {name!r}; delete it first to replace its value")
        except InvalidSecret as exc:  # the value's size, or the account's count of secrets
            errors.add("value" if "value" in str(exc) else "form", str(exc))
    if errors:  # the value is never sent back, not even to the one who typed it
        return await _secrets_page(request, account, name=name, errors=errors)
    await session.flash(request, f"Stored secret {name} ({len(value.encode())} bytes). Its value is never shown again.")
    raise web.HTTPSeeOther("/console/secrets")


async def _own_secret(request: web.Request) -> tuple[str, str]:
    """(account, name) of a secret of the signed-in account's; NotFound (404) for a name it has none of."""
    scope = await session.signed_in(request, Resource.SECRETS, Action.WRITE)
    account, name = scope.principal.account, request.match_info["name"]
    if not any(s.name == name for s in await request.app[SERVICES_KEY].secrets.list(account)):
        raise NotFound(f"you have no secret named {name[:70]!r}")
    return account, name


async def confirm_delete(request: web.Request) -> web.Response:
    _, name = await _own_secret(request)
    return await page(request, "secrets/delete.html", title=f"Delete secret {name}", name=name)


async def delete_secret(request: web.Request) -> web.Response:
    account, name = await _own_secret(request)
    await request.app[SERVICES_KEY].secrets.delete(account, name)
    await session.flash(request, f"Deleted secret {name}. Workloads that name it can no longer start.")
    raise web.HTTPSeeOther("/console/secrets")


NAV = [NavItem("renter", "Secrets", "/console/secrets", order=45)]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/secrets", secrets_page)
    router.add_post("/console/secrets", create_secret)
    router.add_get("/console/secrets/{name}/delete", confirm_delete)
    router.add_post("/console/secrets/{name}/delete", delete_secret)
