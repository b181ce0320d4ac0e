"""``idlegrid endpoint create|list|get|update|delete|keys``: a renter's serverless endpoints (docs/endpoints.md), through
the management API (``run``, ``request`` and ``health``, the requests to one: endpoint_requests.py).

  idlegrid endpoint create --name echo --image IMAGE --gpus 1 --max-workers 4 -- python handler.py
  idlegrid endpoint create -f echo.toml            every field of the spec, flags over the file's
  idlegrid endpoint list | get ID | delete ID
  idlegrid endpoint update ID --max-workers 8      changes only the fields given
  idlegrid endpoint keys create ID [--name ci]     the key is shown this once
  idlegrid endpoint keys list ID | keys revoke ID KEY_ID

Output is a table (or ``key: value`` lines for one endpoint) by default, the API's JSON with ``--json``. The API
checks the spec; its answer names a bad field.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from management.cli import endpoint_requests
from management.cli.connection import api_client, connection_options, show, table, when
from management.cli.workloads import BadSpec, apply_replica_and_env, read_spec_file, registry_auth
from management.client.api import AnswerJson, BodyJson

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]

# flag -> (the spec's table or None, field): the scaling policy and the request bounds
_NUMBERS: dict[str, tuple[str | None, str]] = {
    "min_workers": ("scaling", "min_workers"),
    "max_workers": ("scaling", "max_workers"),
    "idle_timeout_s": ("scaling", "idle_timeout_s"),
    "queue_delay_s": ("scaling", "target_queue_delay_s"),
    "concurrency": ("scaling", "concurrency"),
    "execution_timeout_s": (None, "execution_timeout_s"),
    "ttl_s": (None, "ttl_s"),
    "max_retries": (None, "max_retries"),
    "daily_spend_cap": (None, "daily_spend_cap"),
    "http_port": (None, "http_port"),
    "readiness_path": (None, "readiness_path"),
    "max_held": (None, "max_held"),
    "max_hold_s": (None, "max_hold_s"),
}
MODES = {"queue": "queue", "load-balanced": "load_balanced", "load_balanced": "load_balanced"}  # flag -> the spec's


def add_parsers(sub: argparse._SubParsersAction, make: Parser) -> None:
    """``endpoint`` on the command line's subcommands."""
    p = make(
        sub,
        "endpoint",
        "create, list, show, change and delete serverless endpoints",
        "A serverless endpoint takes requests and runs them on workers that scale with them, to zero and back "
        "(docs/endpoints.md). A renter's key acts for its own account; the operator's sees every account's.",
    )
    e_sub = p.add_subparsers(
        dest="endpoint_command", required=True, metavar="{create,list,get,update,delete,keys,run,request,health}"
    )

    create = make(
        e_sub,
        "create",
        "create an endpoint",
        "Create an endpoint from a spec file (-f, TOML or JSON; every field, see docs/endpoints.md) and/or flags, which "
        "override the file's fields. The worker's command follows '--'. Example:\n"
        "  idlegrid endpoint create --name echo --image ghcr.io/acme/echo:1 --gpus 1 --max-workers 4 -- python handler.py",
    )
    create.add_argument("-f", "--file", type=Path, metavar="SPEC", help="spec file, .toml or .json (default: none, flags only)")
    create.add_argument("--account", help="account it belongs to; operator keys only (default: the key's own account)")
    _spec_options(create, creating=True)
    connection_options(create)
    create.set_defaults(func=_run_create)

    listing = make(e_sub, "list", "list endpoints", "List endpoints by creation: a renter its own, the operator all.")
    listing.add_argument("--account", help="only this account's; operator keys only (default: every account the key sees)")
    connection_options(listing)
    listing.set_defaults(func=_run_list)

    get = make(e_sub, "get", "show one endpoint", "Show one endpoint: its worker, scaling policy and request bounds.")
    get.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    connection_options(get)
    get.set_defaults(func=_run_get)

    update = make(
        e_sub,
        "update",
        "change an endpoint",
        "Change the fields given and keep the rest; -f takes a file of fields to change. --env replaces every "
        "variable (the values are never shown, so give them all again).",
    )
    update.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    update.add_argument(
        "-f", "--file", type=Path, metavar="SPEC", help="file of fields to change, .toml or .json (default: none)"
    )
    _spec_options(update, creating=False)
    connection_options(update)
    update.set_defaults(func=_run_update)

    delete = make(e_sub, "delete", "delete an endpoint", "Delete an endpoint; its invocation keys stop working at once.")
    delete.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    connection_options(delete)
    delete.set_defaults(func=_run_delete)

    keys = make(
        e_sub,
        "keys",
        "an endpoint's invocation keys",
        "Invocation keys call one endpoint's requests and nothing else: no other endpoint, no other route, no spending.",
    )
    k_sub = keys.add_subparsers(dest="endpoint_keys_command", required=True, metavar="{create,list,revoke}")
    k_create = make(k_sub, "create", "make an invocation key", "Make an invocation key; it is shown this once, keep it.")
    k_create.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    k_create.add_argument("--name", default="", help="what to call it (default: 'invocation key')")
    connection_options(k_create)
    k_create.set_defaults(func=_run_key_create)
    k_list = make(k_sub, "list", "an endpoint's keys", "An endpoint's invocation keys, revoked ones too (never the keys).")
    k_list.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    connection_options(k_list)
    k_list.set_defaults(func=_run_key_list)
    k_revoke = make(k_sub, "revoke", "revoke an invocation key", "Revoke an invocation key: refused from now on.")
    k_revoke.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    k_revoke.add_argument("key_id", metavar="KEY_ID", help="the key's id, epk-…")
    connection_options(k_revoke)
    k_revoke.set_defaults(func=_run_key_revoke)
    endpoint_requests.add_parsers(e_sub, make)  # run, request, health: docs/endpoints.md, "The request routes"


def _spec_options(p: argparse.ArgumentParser, *, creating: bool) -> None:
    keep = "the file's" if creating else "unchanged"

    def default(otherwise: str) -> str:
        return f"default: the file's, else {otherwise}" if creating else "default: unchanged"

    p.add_argument("--name", help=f"endpoint name: lowercase letters, digits, '-' (default: {keep})")
    p.add_argument("--image", help=f"the workers' container image, or 'none' with --allow-process-runtime (default: {keep})")
    p.add_argument("--gpus", type=int, metavar="N", help=f"GPUs per worker, 1..16 ({default('1')})")
    p.add_argument("--model", action="append", metavar="KEY", help=f"allowed GPU model, repeatable ({default('any')})")
    p.add_argument("--tier", action="append", metavar="NAME", help=f"allowed tier, repeatable ({default('any')})")
    p.add_argument("--vendor", action="append", metavar="NAME", help=f"GPU vendor, nvidia or amd, repeatable ({default('any')})")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help=f"environment variable, repeatable ({default('none')})")
    p.add_argument(
        "--registry-user",
        metavar="USER",
        help="username for a private image's registry, with --registry-password-env (" + default("pulled anonymously") + ")",
    )
    p.add_argument(
        "--registry-password-env",
        metavar="VAR",
        help="the environment variable holding that registry's password: sent to the hosts only, never shown again "
        "(default: none)",
    )
    p.add_argument(
        "--allow-process-runtime",
        action="store_true",
        default=None,
        help="workers may run as sandboxed host processes where the operator offers such hosts (needed by image 'none'; "
        + default("no")
        + ")",
    )
    p.add_argument("--min-workers", type=int, metavar="N", help=f"workers kept warm, 0 to scale to zero ({default('0')})")
    p.add_argument("--max-workers", type=int, metavar="N", help=f"the most workers, up to 100 ({default('1')})")
    p.add_argument("--idle-timeout-s", type=float, metavar="SECONDS", help=f"an idle worker is kept this long ({default('60')})")
    p.add_argument(
        "--queue-delay-s",
        type=float,
        metavar="SECONDS",
        help=f"add workers when the oldest request has waited longer than this ({default('4')})",
    )
    p.add_argument("--concurrency", type=int, metavar="N", help=f"requests one worker runs at once ({default('1')})")
    p.add_argument("--execution-timeout-s", type=float, metavar="SECONDS", help=f"one attempt at most ({default('600')})")
    p.add_argument("--ttl-s", type=float, metavar="SECONDS", help=f"a request's whole life ({default('86400')})")
    p.add_argument("--max-retries", type=int, metavar="N", help=f"requeues after a lost worker, 0..10 ({default('3')})")
    p.add_argument(
        "--daily-spend-cap",
        metavar="AMOUNT",
        help=f"the most its workers may cost in any 24 hours, e.g. 25.00: at the cap no worker starts ({default('none')})",
    )
    p.add_argument(
        "--mode",
        choices=("queue", "load-balanced"),
        help="queue: requests through the request routes, workers pull them; load-balanced: HTTP to the workers' own "
        f"server on --http-port, at the endpoint's URL ({default('queue')})",
    )
    p.add_argument("--http-port", type=int, metavar="PORT", help=f"load-balanced: the workers' HTTP port ({default('8000')})")
    p.add_argument(
        "--readiness-path",
        metavar="PATH",
        help=f"load-balanced: a worker takes requests once this path answers 200 ({default('/health')})",
    )
    p.add_argument(
        "--max-held",
        type=int,
        metavar="N",
        help=f"load-balanced: requests held while no worker is ready; more are 503 ({default('256')})",
    )
    p.add_argument(
        "--max-hold-s",
        type=float,
        metavar="SECONDS",
        help=f"load-balanced: how long a held request waits for a ready worker before a 503 ({default('120')})",
    )
    p.add_argument(
        "container_command",
        nargs="*",
        metavar="COMMAND",
        help="the worker's command, after '--' (default: " + ("the file's, else the image's)" if creating else "unchanged)"),
    )


def _scale_lines(scale: AnswerJson | None) -> list[tuple[str, str]]:
    """What the autoscaler's last tick found (docs/endpoints.md, "The autoscaler's shell")."""
    if not scale:
        return []
    workers = ", ".join(f"{n} {phase}" for phase, n in scale["workers"].items())
    spent = f"; spent {scale['spent_24h']} in 24 h" if scale.get("spent_24h") is not None else ""
    capped = "" if scale["may_scale_up"] else " (at its spend cap: none starts)"
    return [("now", f"{workers}, {scale['waiting']} waiting{spent}{capped}"), ("why", scale["why"])]


def spec_from(args: argparse.Namespace, base: BodyJson) -> BodyJson:
    """The fields to send: ``base`` (a file's), then the flags given over them."""
    spec = dict(base)
    for field in ("name", "image"):
        if getattr(args, field) is not None:
            spec[field] = getattr(args, field)
    apply_replica_and_env(args, spec)
    if args.registry_user or args.registry_password_env:
        spec["registry_auth"] = registry_auth(args.registry_user, args.registry_password_env)
    if args.allow_process_runtime:
        spec["constraints"] = dict(spec.get("constraints") or {}) | {"allow_process_runtime": True}
    for flag, (table_name, field) in _NUMBERS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if table_name is None:
            spec[field] = value
        else:
            spec[table_name] = dict(spec.get(table_name) or {}) | {field: value}
    if args.mode is not None:
        spec["mode"] = MODES[args.mode]
    if args.container_command:
        spec["command"] = args.container_command
    return spec


def _run_create(args: argparse.Namespace) -> int:
    base = read_spec_file(args.file) if args.file else {}
    spec = spec_from(args, base)
    account = args.account if args.account is not None else spec.pop("account", None)
    for required in ("name", "image"):
        if required not in spec:
            raise BadSpec(f"{required}: give --{required}, or put {required} in a spec file (-f)")
    if account is not None:
        spec["account"] = account
    client, _ = api_client(args)
    return show(args, client.create_endpoint(spec), lambda e: f"endpoint {e['id']} created\n" + _detail(e))


def _run_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.endpoints(account=args.account), lambda b: _rows(b["items"]))


def _run_get(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.endpoint(args.endpoint_id), _detail)


def _run_update(args: argparse.Namespace) -> int:
    changes = spec_from(args, read_spec_file(args.file) if args.file else {})
    if not changes:
        raise BadSpec("nothing to change: give a flag (such as --max-workers 4) or a file of fields (-f)")
    client, _ = api_client(args)
    return show(args, client.update_endpoint(args.endpoint_id, changes), lambda e: f"endpoint {e['id']} updated\n" + _detail(e))


def _run_delete(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.delete_endpoint(args.endpoint_id), lambda b: f"endpoint {b['id']} deleted, and its keys")


def _run_key_create(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(
        args,
        client.create_endpoint_key(args.endpoint_id, args.name),
        lambda k: (
            f"invocation key {k['id']} ({k['name']}) for endpoint {k['endpoint']}:\n{k['key']}\n"
            "It is shown this once: keep it now. It calls this endpoint's requests and nothing else."
        ),
    )


def _run_key_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.endpoint_keys(args.endpoint_id), lambda b: _key_rows(b["items"]))


def _run_key_revoke(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(
        args,
        client.revoke_endpoint_key(args.endpoint_id, args.key_id),
        lambda k: f"invocation key {k['id']} revoked ({when(k['revoked_at'])})",
    )


# --- output ------------------------------------------------------------------------------------------


def _workers(scaling: AnswerJson) -> str:
    return f"{scaling['min_workers']}..{scaling['max_workers']}"


def _gpus(spec: AnswerJson) -> str:
    replica = spec.get("replica") or {}
    models = ",".join(replica.get("models") or []) or "any"
    return f"{replica.get('gpus', 1)} x {models}"


def _rows(items: Sequence[AnswerJson]) -> str:
    if not items:
        return "no endpoint"
    return table(
        ["ID", "NAME", "ACCOUNT", "IMAGE", "GPUS", "WORKERS", "CONCURRENCY", "CREATED"],
        [
            [
                e["id"],
                e["name"],
                e["account"],
                e["spec"]["image"],
                _gpus(e["spec"]),
                _workers(e["spec"]["scaling"]),
                e["spec"]["scaling"]["concurrency"],
                when(e["created_at"]),
            ]
            for e in items
        ],
    )


def _detail(e: AnswerJson) -> str:
    spec, scaling = e["spec"], e["spec"]["scaling"]
    auth = spec.get("registry_auth")
    lines = [
        ("id", e["id"]),
        ("name", e["name"]),
        ("account", e["account"]),
        ("image", spec["image"] + (" (process runtime)" if spec["constraints"].get("allow_process_runtime") else "")),
        ("command", " ".join(spec["command"]) or "the image's"),
        ("gpus", _gpus(spec)),
        ("env", ", ".join(spec["env"]) or "none"),  # the names: values are never shown
        ("registry", f"user {auth['username']}" if auth else "anonymous"),
        ("workers", f"{_workers(scaling)} (idle ones stop after {scaling['idle_timeout_s']:g} s)"),
        ("scale up", f"when a request waits over {scaling['target_queue_delay_s']:g} s"),
        ("concurrency", f"{scaling['concurrency']} request(s) per worker"),
        (
            "requests",
            f"{spec['execution_timeout_s']:g} s per attempt, {spec['ttl_s']:g} s in all, "
            f"{spec['max_retries']} retries after a lost worker",
        ),
        ("spend cap", f"{spec['daily_spend_cap']} a day" if spec.get("daily_spend_cap") else "none"),
        *_mode_lines(e),
        *_scale_lines(e.get("scale")),
        ("created", when(e["created_at"])),
        ("updated", when(e["updated_at"])),
    ]
    return "\n".join(f"{k + ':':<13}{v}" for k, v in lines)


def _mode_lines(e: AnswerJson) -> list[tuple[str, str]]:
    spec = e["spec"]
    if spec.get("mode", "queue") != "load_balanced":
        return [("mode", "queue (idlegrid endpoint run)")]
    return [
        ("mode", f"load-balanced: port {spec['http_port']}, ready when {spec['readiness_path']} answers 200"),
        ("held", f"up to {spec['max_held']} requests for {spec['max_hold_s']:g} s while no worker is ready"),
        ("url", e.get("url") or "the Master serves no links listener"),
    ]


def _key_rows(items: Sequence[AnswerJson]) -> str:
    if not items:
        return "no invocation key"
    return table(
        ["ID", "NAME", "CREATED", "REVOKED"],
        [[k["id"], k["name"], when(k["created_at"]), when(k["revoked_at"])] for k in items],
    )
