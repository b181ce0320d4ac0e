"""``idlegrid workload submit|list|get|explain|cancel``: a renter's (or the operator's) workloads, through the management API.

Output is a table (or ``key: value`` lines for one workload) by default, the API's JSON with ``--json``.
The API and the key are found as ``idlegrid account`` finds them, with the same options (management/cli/connection.py:
``connection_options``, ``resolve_credentials``).
A spec is checked here first (the same struct the API decodes), so a bad field is named before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from common.errors import IdlegridError
from common.restart_policy import RESTART_POLICIES
from management.cli.connection import api_client, connection_options, table, when
from management.cli.templates import (
    LINK_SILENT_EXIT,
    add_launch_options,
    apply_links,
    link_wait_s,
    print_links_when_up,
    template_base,
)
from management.client.api import AnswerJson, ApiError
from management.market.money import BadAmount, amount_text, format_amount, parse_amount
from management.workloads.explain_text import render_explanation
from management.workloads.state_names import WorkloadState

if TYPE_CHECKING:
    from master.port import SpecJson  # the Master's published interface is slow to import: for types only


TABLE_COLUMNS = ("ID", "NAME", "ACCOUNT", "STATE", "REPLICAS", "GPUS", "PRIORITY", "CREATED", "REASON")

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]


class BadSpec(IdlegridError):
    code = "bad_request"


def add_parser(sub: argparse._SubParsersAction, make: Parser) -> None:
    p = make(
        sub,
        "workload",
        "submit, list, show and cancel workloads",
        "Submit a workload (containers on rented GPUs), list and show your workloads, cancel one. A renter's API key "
        "acts for its own account; the operator's key sees every account's and names the account when it submits.",
    )
    w_sub = p.add_subparsers(
        dest="workload_command", required=True, metavar="{submit,list,get,explain,cancel,logs,exec,port-forward}"
    )

    submit = make(
        w_sub,
        "submit",
        "submit a workload; it waits in the queue until the scheduler places it",
        "Submit a workload from a spec file (-f, TOML or JSON; every field, see docs/workloads.md) and/or flags, "
        "which override the file's fields. The command to run follows '--'. Examples:\n"
        "  idlegrid workload submit --name train --image ghcr.io/acme/train:1 --gpus 2 --model h100-sxm -- python train.py\n"
        "  idlegrid workload submit -f train.toml --replicas 4",
    )
    submit.add_argument("-f", "--file", type=Path, metavar="SPEC", help="spec file, .toml or .json (default: none, flags only)")
    submit.add_argument("--name", help="workload name: lowercase letters, digits, '-' (default: the file's)")
    submit.add_argument("--image", help="container image (default: the file's)")
    submit.add_argument("--replicas", type=int, metavar="N", help="copies to run, 1..64 (default: the file's, else 1)")
    submit.add_argument(
        "--network",
        choices=("overlay", "none"),
        help="a gang's network: 'overlay', a private network its replicas reach each other on (MASTER_ADDR, RANK, "
        "WORLD_SIZE...), or 'none' for replicas that need not (default: the file's, else overlay)",
    )
    submit.add_argument("--gpus", type=int, metavar="N", help="GPUs per replica, 1..16 (default: the file's, else 1)")
    submit.add_argument("--model", action="append", metavar="KEY", help="allowed GPU model, repeatable (default: any)")
    submit.add_argument("--tier", action="append", metavar="NAME", help="allowed tier, repeatable (default: any)")
    submit.add_argument(
        "--vendor", action="append", metavar="NAME", help="GPU vendor, nvidia or amd (CUDA or ROCm), repeatable (default: any)"
    )
    submit.add_argument("--priority", metavar="CLASS", help="low, normal, high or critical (default: the file's, else normal)")
    submit.add_argument("--project", metavar="NAME", help="project to account it to (default: the file's, else 'default')")
    submit.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable, repeatable (default: none)")
    submit.add_argument("--port", action="append", type=int, metavar="PORT", help="port to expose, repeatable (default: none)")
    submit.add_argument(
        "--registry-user",
        metavar="USER",
        help="username for a private image's registry, with --registry-password-env (default: pulled anonymously)",
    )
    submit.add_argument(
        "--registry-password-env",
        metavar="VAR",
        help="the environment variable holding that registry's password or token: never on the command line, sent to "
        "the hosts only, never shown again (default: none)",
    )
    submit.add_argument("--max-duration-s", type=float, metavar="SECONDS", help="stop it after this long (default: no limit)")
    submit.add_argument("--disk", type=float, metavar="GIB", help=DISK_HELP)
    submit.add_argument("--account", help="account it belongs to; operator keys only (default: the key's own account)")
    submit.add_argument(
        "--allow-process-runtime",
        action="store_true",
        default=None,
        help="it may run on hosts that sandbox it as a host process, not a container, where the operator offers such "
        "hosts, as the demo does (default: the file's constraints.allow_process_runtime, else no)",
    )
    add_launch_options(submit)
    restart_options(submit)
    storage_options(submit)
    submit.add_argument(
        "container_command",
        nargs="*",
        metavar="COMMAND",
        help="command to run in the container, after '--' (default: the image's)",
    )
    _connection(submit)
    submit.set_defaults(func=run_submit)

    listing = make(
        w_sub, "list", "list workloads, newest first", "List workloads, newest first: a renter its own, the operator all."
    )
    listing.add_argument("--state", help="only workloads in this state, e.g. queued or running (default: every state)")
    listing.add_argument("--account", help="only this account's; operator keys only (default: every account the key sees)")
    _connection(listing)
    listing.set_defaults(func=run_list)

    get = make(
        w_sub,
        "get",
        "show one workload",
        "Show one workload: its spec (env values are never shown), state and placement; for a queued one, also why it "
        "waits (as 'workload explain' tells it).",
    )
    get.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    _connection(get)
    get.set_defaults(func=run_get)

    explain = make(
        w_sub,
        "explain",
        "say why a queued workload waits",
        "Say why a queued workload waits: the scheduler's sentence, its place in the queue, what blocks it (a workload "
        "ahead with GPUs reserved, the account's quota), the reserved and estimated start, and how many GPUs each "
        "constraint of the request removed. A workload that is not queued answers 409.",
    )
    explain.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    _connection(explain)
    explain.set_defaults(func=run_explain)

    cancel = make(
        w_sub, "cancel", "cancel a workload", "Cancel a workload in any state that is not final; its containers are deleted."
    )
    cancel.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    _connection(cancel)
    cancel.set_defaults(func=run_cancel)

    from management.cli.access import add_parsers as add_access_parsers

    add_access_parsers(w_sub, make, _connection)
    from management.cli.ssh import add_workload_parsers as add_ssh_parsers

    add_ssh_parsers(w_sub, make, _connection)


def _connection(p: argparse.ArgumentParser) -> None:
    connection_options(p)


def _client(args: argparse.Namespace) -> Any:
    return api_client(args)[0]


# --- submit ---------------------------------------------------------------------------------------


def read_spec_file(path: Path) -> SpecJson:
    """A spec file's fields: TOML by default, JSON for a .json file; errors name the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadSpec(f"cannot read the spec file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise BadSpec(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
    if not isinstance(data, dict):
        raise BadSpec(f"{path} must hold a table of spec fields")
    return _amounts_as_text(data, path)


RENTAL_AMOUNTS = ("bid", "max_price")  # the spec's amounts of money: text in the API, a number in a file too


def _amounts_as_text(data: SpecJson, path: Path) -> SpecJson:
    """``bid = 0.5`` in a file is the amount ``"0.5"``, as if quoted (money is exact decimal text, never a float)."""
    rental = data.get("rental")
    if not isinstance(rental, dict):
        return data
    rental = dict(rental)
    for field in RENTAL_AMOUNTS:
        number = rental.get(field)
        if isinstance(number, int | float) and not isinstance(number, bool):
            try:
                rental[field] = amount_text(number)
            except BadAmount as exc:
                raise BadSpec(f"{path}: rental.{field}: {exc}") from None
    return data | {"rental": rental}


DISK_HELP = "only hosts reporting at least this much free disk, GiB (default: the file's, else any host)"


def apply_replica_and_env(args: argparse.Namespace, spec: SpecJson) -> None:
    """The flags a workload and an endpoint's worker share, over ``spec``'s own: --gpus, --model, --vendor, --tier,
    --env."""
    replica = dict(spec.get("replica") or {})
    if args.gpus is not None:
        replica["gpus"] = args.gpus
    if args.model:
        replica["models"] = args.model
    if getattr(args, "vendor", None):  # not on every command that shares these flags
        replica["vendors"] = args.vendor
    if args.tier:
        replica["tiers"] = args.tier
    if replica:
        spec["replica"] = replica
    if args.env:
        spec["env"] = dict(spec.get("env") or {}) | dict(env_pair(e) for e in args.env)


def spec_from(args: argparse.Namespace) -> SpecJson:
    """The spec to send: the file's fields, then the flags given over them; checked as the API will check it."""
    spec = template_base(args) | (read_spec_file(args.file) if args.file else {})
    account = spec.pop("account", None)
    for field in ("name", "image", "replicas", "priority", "project", "max_duration_s"):
        if getattr(args, field) is not None:
            spec[field] = getattr(args, field)
    if getattr(args, "network", None) is not None:  # not on rent
        spec["network"] = args.network
    apply_replica_and_env(args, spec)
    if args.port:
        spec["ports"] = args.port
        spec["links"] = [link for link in spec.get("links") or [] if link["port"] in args.port]
    apply_links(args, spec)
    user, variable = getattr(args, "registry_user", None), getattr(args, "registry_password_env", None)  # not on rent
    if user or variable:
        spec["registry_auth"] = registry_auth(user, variable)
    if args.container_command:
        spec["command"] = args.container_command
    _storage_flags(args, spec)
    if args.allow_process_runtime:
        spec["constraints"] = dict(spec.get("constraints") or {}) | {"allow_process_runtime": True}
    if getattr(args, "disk", None) is not None:
        spec["constraints"] = dict(spec.get("constraints") or {}) | {"min_disk_gib": args.disk}
    for field in ("restart_policy", "max_restarts"):
        if getattr(args, field, None) is not None:
            spec[field] = getattr(args, field)
    if getattr(args, "max_restarts", None) is not None and spec.get("restart_policy") == "never":
        raise BadSpec("--max-restarts counts restarts under --restart-policy on_failure or always; this one is never")
    for required in ("name", "image"):
        if required not in spec:
            raise BadSpec(f"{required}: give --{required}, a --template, or put {required} in a spec file (-f)")
    from master.port import WorkloadSpec  # the Master's published interface is slow to import: only when a spec is sent

    try:
        msgspec.convert(spec, WorkloadSpec)
    except msgspec.ValidationError as exc:
        raise BadSpec(f"the spec is refused: {_where(exc)}") from None
    if args.account is not None or account is not None:
        spec["account"] = args.account if args.account is not None else account
    return spec


def restart_options(p: argparse.ArgumentParser) -> None:
    """--restart-policy and --max-restarts, for submit and rent."""
    p.add_argument(
        "--restart-policy",
        choices=RESTART_POLICIES,
        help="back to the queue when a container fails (on_failure), also when all exit 0 (always), or never "
        "(default: the file's, else on_failure for work with a --checkpoint or a --bid, never for the rest)",
    )
    p.add_argument(
        "--max-restarts",
        type=_restarts,
        metavar="N",
        help="the most restarts, 0..1000, under on_failure or always (default: the file's, else 3)",
    )


def _restarts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of restarts") from None
    if not 0 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"{n} restarts is out of range: give 0..1000")
    return n


def storage_options(p: argparse.ArgumentParser) -> None:
    """Object storage flags, on ``workload submit`` and ``rent`` alike (docs/storage.md)."""
    p.add_argument(
        "--input",
        action="append",
        metavar="URI:PATH",
        help="fetch s3://BUCKET/KEY (one object) or s3://BUCKET/PREFIX/ (every object under it) into PATH before the "
        "command starts, repeatable (default: none)",
    )
    p.add_argument(
        "--output",
        action="append",
        metavar="URI:PATH",
        help="upload what the container leaves in PATH to s3://BUCKET/PREFIX/ at its end, repeatable (default: none)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="URI[:PATH]",
        help="the checkpoint directory (default PATH /checkpoint): restored before the command starts wherever it runs, "
        "uploaded on a period and at every stop; the program finds it in $IDLEGRID_CHECKPOINT_DIR (default: none)",
    )
    p.add_argument("--checkpoint-period", type=float, metavar="SECONDS", help="upload what changed this often (default: 300)")
    p.add_argument(
        "--storage-credentials",
        metavar="SECRET",
        help="your secret holding the store's keys as ACCESS_KEY_ID:SECRET_ACCESS_KEY (idlegrid secret create; default: "
        "the spec file's, else none)",
    )
    p.add_argument(
        "--storage-endpoint", metavar="URL", help="an S3-compatible endpoint, e.g. https://minio.example:9000 (default: AWS S3)"
    )
    p.add_argument("--storage-region", metavar="REGION", help="the store's region (default: us-east-1)")
    p.add_argument(
        "--stop-grace",
        type=float,
        metavar="SECONDS",
        help="SIGTERM to SIGKILL when the grid stops it, 1..600 (default: the grid's)",
    )


def _location(flag: str, text: str, default_path: str | None = None) -> dict[str, str]:
    """``s3://bucket/key:/path`` -> {"uri", "path"}: split at the last ':' that starts an absolute path."""
    at = text.rfind(":/")
    if at > len("s3:/"):
        return {"uri": text[:at], "path": text[at + 1 :]}
    if default_path is not None:
        return {"uri": text, "path": default_path}
    raise BadSpec(f"{flag} {text!r}: write it as s3://BUCKET/KEY:/path/in/container")


def _storage_flags(args: argparse.Namespace, spec: SpecJson) -> None:
    if getattr(args, "input", None):
        spec["inputs"] = list(spec.get("inputs") or []) + [_location("--input", t) for t in args.input]
    if getattr(args, "output", None):
        spec["outputs"] = list(spec.get("outputs") or []) + [_location("--output", t) for t in args.output]
    if getattr(args, "checkpoint", None):
        spec["checkpoint"] = dict(spec.get("checkpoint") or {}) | _location("--checkpoint", args.checkpoint, "/checkpoint")
    if getattr(args, "checkpoint_period", None) is not None:
        if "checkpoint" not in spec:
            raise BadSpec("--checkpoint-period needs --checkpoint")
        spec["checkpoint"] = dict(spec["checkpoint"]) | {"period_s": args.checkpoint_period}
    access = dict(spec.get("storage") or {})
    for flag, field in (("storage_credentials", "credentials"), ("storage_endpoint", "endpoint"), ("storage_region", "region")):
        if getattr(args, flag, None):
            access[field] = getattr(args, flag)
    if access:
        spec["storage"] = access
    if getattr(args, "stop_grace", None) is not None:
        spec["stop_grace_s"] = args.stop_grace


def registry_auth(user: str | None, variable: str | None) -> dict[str, str]:
    if not user or not variable:
        raise BadSpec("a private registry needs both --registry-user and --registry-password-env")
    password = os.environ.get(variable, "")
    if not password:
        raise BadSpec(f"--registry-password-env {variable}: that environment variable is not set or empty")
    return {"username": user, "password": password}


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise BadSpec(f"--env {text!r}: write it as KEY=VALUE")
    return key, value


def _where(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    message, sep, path = text.rpartition(" - at `$.")
    return f"{path.rstrip('`')}: {message}" if sep else text


def cost_line(client: Any, workload: AnswerJson) -> str:
    """What the workload costs per hour, when known, and how long the renter's balance lasts (``lasting``). Empty when
    the price is not known yet (on demand on whichever host it is placed); the price alone when the balance cannot be
    read."""
    terms = workload.get("rental") or {}
    per_hour = terms.get("per_hour")
    if per_hour is None:
        return ""
    line = f"total {per_hour} {terms.get('currency', '')} per hour"
    try:
        funds = client.balance(workload["account"])
    except ApiError:  # a key that may not read the account's balance: the price alone
        return line
    lasting = balance_lasting(funds, per_hour, counted=workload.get("state") == WorkloadState.RUNNING)
    return f"{line}; {lasting}" if lasting else line


def balance_lasting(funds: AnswerJson, per_hour: str, *, counted: bool) -> str:
    """How long the balance (``GET /accounts/{id}/balance``) lasts with this work added to what already runs, saying
    what the rate counts: "the balance of 12.50 USD lasts about 2.1 h at 6.00 USD per hour: 1.20 for this workload and
    4.80 for what already runs". ``counted``: the work already runs, so what runs now includes it. Empty when nothing
    costs anything."""
    currency = funds["currency"]
    have = parse_amount(funds["available"]) + parse_amount(funds["held"])
    running, this = parse_amount(funds["running_per_hour"]), parse_amount(per_hour)
    rate = running if counted else running + this
    if rate <= 0:
        return ""
    said = f"the balance of {format_amount(have)} {currency} lasts about {have / rate:.1f} h at"
    if counted:
        return f"{said} {format_amount(rate)} {currency} per hour, the rate of all that runs now (this workload included)"
    if running == 0:
        return f"{said} that rate (nothing else runs now)"
    others = format_amount(running)
    return f"{said} {format_amount(rate)} {currency} per hour: {per_hour} for this workload and {others} for what already runs"


def run_submit(args: argparse.Namespace) -> int:
    spec = spec_from(args)
    account = spec.pop("account", None)
    client = _client(args)
    workload = client.submit_workload(spec, account=account)

    def human(w: AnswerJson) -> None:
        print(f"submitted {w['id']} ({w['name']}) for account {w['account']}: {w['state']}")
        cost = cost_line(client, w)
        if cost:
            print(cost)

    _print(args, workload, human)
    if not args.json and not print_links_when_up(client, workload, link_wait_s(args)):
        return LINK_SILENT_EXIT
    return 0


# --- list, get, explain, cancel ----------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    workloads = _client(args).list("/api/v1/workloads", state=args.state, account=args.account)
    _print(args, workloads, lambda ws: print(table(TABLE_COLUMNS, [_row(w) for w in ws]) if ws else "no workloads"))
    return 0


def run_get(args: argparse.Namespace) -> int:
    client = _client(args)
    _print(args, client.workload(args.workload_id), lambda w: print(describe(w) + _links(client, w) + _why_it_waits(client, w)))
    return 0


def _links(client: Any, workload: AnswerJson) -> str:
    """The workload's HTTPS links, one line each ("" when it has none)."""
    links = client.workload_links(workload["id"])["items"]
    return "".join(f"\nlink:        {v['url']}  (port {v['port']}, {'public' if v['public'] else 'private'})" for v in links)


def _why_it_waits(client: Any, workload: AnswerJson) -> str:
    """For a queued workload, the explanation under a heading; "" for any other (or one placed meanwhile)."""
    from management.client.api import ApiError

    if workload["state"] != WorkloadState.QUEUED:
        return ""
    try:
        explanation = client.explain_workload(workload["id"])
    except ApiError as exc:
        if exc.status != 409:  # 409: placed since it was read, nothing to explain any more
            raise
        return ""
    return "\n\nwhy it waits:\n" + _indent(render_explanation(workload, explanation, datetime.now(UTC)))


def run_explain(args: argparse.Namespace) -> int:
    client = _client(args)
    try:
        explanation = client.explain_workload(args.workload_id)
    except ApiError as exc:
        if exc.code != "conflict" or args.json:
            raise
        # Not waiting (it runs, or has ended): the answer to "why does it wait" is that it does not.
        w = client.workload(args.workload_id)
        state = f"{w['state']} ({w['state_reason']})"
        print(f"{w['id']} ({w['name']}) does not wait: it is {state}; 'idlegrid workload get' shows it")
        return 0
    now = datetime.now(UTC)
    _print(args, explanation, lambda e: print(render_explanation(client.workload(args.workload_id), e, now)))
    return 0


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.splitlines())


def run_cancel(args: argparse.Namespace) -> int:
    workload = _client(args).cancel_workload(args.workload_id)
    _print(args, workload, lambda w: print(f"{w['id']} ({w['name']}): {w['state']} ({w['state_reason']})"))
    return 0


def _print(args: argparse.Namespace, answer: Any, human: Callable[[Any], None]) -> None:
    if args.json:
        json.dump(answer, sys.stdout, indent=2)
        print()
    else:
        human(answer)


def _row(w: AnswerJson) -> list[str]:
    spec = w["spec"]
    return [
        w["id"],
        w["name"],
        w["account"],
        w["state"],
        str(spec["replicas"]),
        str(spec["replica"]["gpus"]),
        spec["priority"],
        when(w["created_at"]),
        w["state_reason"],
    ]


def describe(w: AnswerJson) -> str:
    spec = w["spec"]
    replica = spec["replica"]
    lines = [
        f"id:          {w['id']}",
        f"name:        {w['name']}",
        f"account:     {w['account']}  (project {spec['project']})",
        *_state_lines(w),
        *([f"detail:      {w['detail']}"] if w.get("detail") else []),
        f"image:       {spec['image']}"
        + (f"  (registry user {spec['registry_auth']['username']})" if spec.get("registry_auth") else ""),
        f"command:     {' '.join(spec['command']) or '(the image default)'}",
        f"replicas:    {spec['replicas']} x {replica['gpus']} GPU"
        + (f" ({', '.join(replica['models'])})" if replica["models"] else ""),
        *_network_lines(w),
        f"priority:    {spec['priority']}",
        f"rental:      {w['rental']['summary']}" if w.get("rental") else "rental:      -",
        f"env:         {', '.join(spec['env']) or '-'}  (values are never shown)",
        f"ports:       {', '.join(map(str, spec['ports'])) or '-'}",
        f"submitted:   {when(w['created_at']) or '-'}   attempts: {w['attempts']}   restarts: {w['restarts']}",
        f"started:     {when(w['started_at']) or '-'}   finished: {when(w['finished_at']) or '-'}",
    ]
    lines += _storage_lines(spec, w.get("storage"))
    for a in w["assignments"]:
        lines.append(f"replica {a['replica']}:   {a['container']} on {a['agent_id']} ({', '.join(a['units'])}) {a['state']}")
    return "\n".join(lines)


def _network_lines(w: AnswerJson) -> list[str]:
    """A gang's network (docs/overlay.md): its block and each replica's address and peers, or why it has none."""
    if w["spec"]["replicas"] < 2:
        return []
    network = w.get("network")
    if network:
        replicas = [f"replica {r['replica']} {r['address']}" for r in network["replicas"]]
        return [f"network:     {network['network']}: {', '.join(replicas)}"]
    if w["spec"].get("network") == "none":
        return ["network:     none (its spec asks for none)"]
    return ["network:     none yet (a gang gets its network when it is first placed)"]


def _state_lines(w: AnswerJson) -> list[str]:
    """The state and its reason; a failed workload's reason goes on with its last lines of output, one a line."""
    first, *rest = w["state_reason"].split("\n")
    return [f"state:       {w['state']}  ({first})", *(f"             {line}" for line in rest)]


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def _storage_lines(spec: AnswerJson, storage: AnswerJson | None) -> list[str]:
    """The workload's data (docs/storage.md): where it lives, its last checkpoint, what its hosts moved."""
    lines = [f"input:       {m['uri']} -> {m['path']}" for m in spec.get("inputs") or []]
    lines += [f"output:      {m['path']} -> {m['uri']}" for m in spec.get("outputs") or []]
    checkpoint = spec.get("checkpoint")
    if checkpoint:
        lines.append(f"checkpoint:  {checkpoint.get('path', '/checkpoint')} <-> {checkpoint['uri']}")
    if storage:
        taken = when(storage["checkpoint_at"])
        lines.append(
            f"last checkpoint: {taken + ', ' + _size(storage['checkpoint_bytes']) if taken else 'none yet'}"
            + (f"   resumed from: {when(storage['restored_from'])}" if storage.get("restored_from") else "")
            + f"   moving data: {storage['transfer_s']:.1f} s"
        )
        if storage.get("last_error"):
            lines.append(f"storage error: {storage['last_error']}")
    return lines
