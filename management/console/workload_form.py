"""The launch and rent forms' fields beyond the basics: replicas, the restart policy, links, environment variables
that name a stored secret, and a private registry's credentials (docs/console-pages.md, "The renter's offers and
forms").

Each reader takes the form and ``FormErrors`` and gives the spec's own fields, as ``idlegrid workload submit`` builds
them; a problem is kept beside its field. Pure but for ``with_registry_auth``, which reads the password secret's value
through the services (the spec carries the password itself; the form names a stored secret instead of asking for it).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection

import msgspec
from aiohttp import web

from common.errors import NotFound
from common.storage import SECRET_REF
from management.console.forms import FormErrors, FormFields, integer, text
from management.console.workload_storage import field_of as storage_field_of
from management.http.keys import SERVICES_KEY
from master.port import MAX_REPLICAS, RESTART_POLICIES, SpecJson, WorkloadSpec

# "": what a renter means (the spec's restart_policy left out): on failure for work with a checkpoint or a bid, else never
RESTART_LABELS = {"": "Default", "never": "Never", "on_failure": "On failure", "always": "Always"}
RESTART_HINT = (
    "On failure: a non-zero exit or a lost host runs it again; always: whenever it exits; never: an exit ends it. "
    "Default: on failure when it has a checkpoint or a bid, never otherwise."
)
assert tuple(RESTART_LABELS)[1:] == RESTART_POLICIES  # one owner of the set: common/restart_policy.py
LINK_ACCESS = ("private", "public", "tcp")  # private/public: an http link (docs/links.md); tcp: port-forward or SSH only
SECRET_ROWS = 3  # rows of "variable from a secret" the form shows
PROCESS_IMAGE = "none"  # the image of work that runs as a sandboxed process: nothing to pull, no container engine


def gang_fields(form: FormFields, errors: FormErrors) -> SpecJson:
    """``replicas``, ``network``, ``restart_policy`` and ``max_restarts`` as the spec takes them (``no_network``
    ticked: a gang whose replicas need not reach each other, which a grid without a gang overlay takes too)."""
    replicas = integer(form, "replicas", errors, label="replicas", low=1, high=MAX_REPLICAS, default=1)
    policy = text(form, "restart_policy") or None
    if policy is not None and policy not in RESTART_POLICIES:
        errors.add("restart_policy", f"restart policy: one of {', '.join(RESTART_POLICIES)}")
    restarts = integer(form, "max_restarts", errors, label="max restarts", low=0, high=1000, default=3)
    network = "none" if form.get("no_network") == "on" else "overlay"
    return {
        "replicas": replicas or 1,
        "network": network,
        "restart_policy": policy,
        "max_restarts": 3 if restarts is None else restarts,
    }


def link_fields(form: FormFields, errors: FormErrors, ports: list[int]) -> list[SpecJson]:
    """Links typed one ``PORT private|public|tcp`` a line (``8888`` alone is private); a port linked and not declared
    is declared with it (added to ``ports``)."""
    links: list[SpecJson] = []
    for n, line in enumerate(text(form, "links", max_length=8192).splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        port, access = parts[0], parts[1].lower() if len(parts) > 1 else "private"
        if len(parts) > 2 or not port.isdigit() or not 1 <= int(port) <= 65535 or access not in LINK_ACCESS:
            errors.add("links", f"links, line {n}: PORT private, PORT public or PORT tcp, not {line.strip()[:40]!r}")
            continue
        if any(link["port"] == int(port) for link in links):
            errors.add("links", f"links, line {n}: port {port} is linked twice")
            continue
        links.append({"port": int(port), "kind": "tcp" if access == "tcp" else "http", "public": access == "public"})
        if int(port) not in ports:
            ports.append(int(port))
    return links


def secret_env(form: FormFields, errors: FormErrors, env: dict[str, str], secret_names: Collection[str]) -> None:
    """Add to ``env`` each row's variable set from a stored secret (``${secret:NAME}``, resolved on the host)."""
    for row in range(SECRET_ROWS):
        variable, secret = text(form, f"secret_var_{row}"), text(form, f"secret_name_{row}")
        field = f"secret_var_{row}"
        if not variable and not secret:
            continue
        if not variable or not secret:
            errors.add(field, "secret variable: give both the variable's name and the secret")
        elif secret not in secret_names:
            errors.add(field, f"secret variable: no secret named {secret!r} in this account (store it on the Secrets page)")
        elif variable in env:
            errors.add(field, f"secret variable: {variable} is set twice (also among the environment variables)")
        else:
            env[variable] = f"${{secret:{secret}}}"


def process_allowed(form: FormFields) -> bool:
    """May it run as a sandboxed process: the box, or the image ``none`` (which only a process can run)."""
    return form.get("allow_process_runtime") == "on" or text(form, "image") == PROCESS_IMAGE


def registry_fields(form: FormFields, errors: FormErrors, secret_names: Collection[str]) -> tuple[str, str] | None:
    """(username, password secret's name) for a private image's registry; None when left empty."""
    user, secret = text(form, "registry_user", max_length=256), text(form, "registry_secret")
    if not user and not secret:
        return None
    if not user or not secret:
        errors.add("registry_user", "registry: give both the username and the secret that holds its password or token")
        return None
    if secret not in secret_names:
        errors.add("registry_user", f"registry: no secret named {secret!r} in this account")
        return None
    return user, secret


async def with_registry_auth(
    request: web.Request, account: str, spec: WorkloadSpec | None, registry: tuple[str, str] | None, errors: FormErrors
) -> WorkloadSpec | None:
    """The spec with its registry credentials, the password read from the account's secret."""
    if spec is None or registry is None:
        return spec
    try:
        auth = await request.app[SERVICES_KEY].secrets.registry_auth(account, *registry)
    except NotFound as exc:  # deleted since the form was shown
        errors.add("registry_user", f"registry: {exc}")
        return None
    return msgspec.structs.replace(spec, registry_auth=auth)


FIELDS_BY_PREFIX = {
    "image": "image", "name": "name", "command": "command", "env": "env", "ports": "ports", "links": "links",
    "replicas": "replicas", "restart_policy": "restart_policy", "max_restarts": "max_restarts", "registry_auth": "registry_user",
    "replica": "gpus", "constraints": "disk_gib", "max_duration_s": "max_hours", "rental": "kind",
}  # fmt: skip


def refused_field(message: str) -> str:
    """The form field a submit's refusal names ("image: registry ... is not allowed" -> "image"); "form" otherwise."""
    head = message.split(":", 1)[0].split(".")[0].split("[")[0].strip()
    if head in FIELDS_BY_PREFIX:
        return FIELDS_BY_PREFIX[head]
    return storage_field_of(message)  # the storage block's own fields (a store the egress rule refuses, ...)


def form_from_spec(spec: WorkloadSpec, secret_names: Collection[str]) -> tuple[dict[str, str], list[str]]:
    """The launch form filled in from a workload's spec (Clone), and what could not be copied, in words: env values
    typed in the clear and a registry password are never shown again, so they are left for the renter to give."""
    links = {link.port: link for link in spec.links}
    form: dict[str, str] = {
        "name": spec.name, "image": spec.image, "command": shlex.join(spec.command), "gpus": str(spec.replica.gpus),
        "model": spec.replica.models[0] if len(spec.replica.models) == 1 else "",
        "max_hours": f"{spec.max_duration_s / 3600:g}" if spec.max_duration_s else "",
        "ports": ", ".join(str(p) for p in spec.ports if p not in links),
        "links": "\n".join(f"{p} {'tcp' if k.kind == 'tcp' else 'public' if k.public else 'private'}" for p, k in links.items()),
        "replicas": str(spec.replicas), "restart_policy": spec.restart_policy or "", "max_restarts": str(spec.max_restarts),
        "disk_gib": f"{spec.constraints.min_disk_gib:g}" if spec.constraints.min_disk_gib else "",
        "allow_process_runtime": "on" if spec.constraints.allow_process_runtime else "",
        "no_network": "on" if spec.network == "none" else "",
        "kind": spec.rental.kind if spec.rental is not None else "on_demand",
    }  # fmt: skip
    if spec.rental is not None:
        form["bid"] = spec.rental.bid or ""
        form["max_price"] = spec.rental.max_price or ""
        form["reserved_hours"] = f"{spec.rental.reserved_s / 3600:g}" if spec.rental.reserved_s else ""
    left: list[str] = []
    row = 0
    for name, value in spec.env.items():
        secret = SECRET_REF.match(value)
        if secret is not None and row < SECRET_ROWS and secret.group(1) in secret_names:
            form[f"secret_var_{row}"], form[f"secret_name_{row}"] = name, secret.group(1)
            row += 1
        else:
            left.append(name)
    notes = []
    if left:
        notes.append(f"environment variables {', '.join(left)}: their values are never shown again; type them again")
    if spec.registry_auth is not None:
        form["registry_user"] = spec.registry_auth.username
        notes.append("the registry password: choose the secret that holds it again")
    if spec.inputs or spec.outputs or spec.checkpoint is not None:
        notes.append("object storage (inputs, outputs, checkpoint): give it again below")
    return form, notes
