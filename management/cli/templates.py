"""``idlegrid template list|show`` and what ``--template`` and ``--link`` add to ``workload submit`` and ``rent``
(docs/templates.md, docs/links.md): a spec that starts from a template (the flags given over it win), http ports
declared as links, and, once the workload runs, its links printed as soon as they answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.errors import IdlegridError
from management.cli.connection import api_client, connection_options, table
from management.client.api import AnswerJson, ApiError
from management.workloads.state_names import FINAL_WORKLOAD_STATES, WorkloadState

if TYPE_CHECKING:
    from master.port import SpecJson  # the Master's published interface is slow to import: for types only


Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]
LINK_WAIT_S = 600.0  # how long `--template` waits for the link by default: an image pull can take minutes
POLL_S = 2.0
LINK_SILENT_EXIT = 3  # the workload was submitted, but its links did not answer within --wait-link-s (or it ended)


class BadLink(IdlegridError):
    code = "bad_request"


def add_parsers(sub: argparse._SubParsersAction, make: Parser) -> None:
    p = make(
        sub,
        "template",
        "launch templates: list them, show one",
        "Launch templates are ready workloads (image, command, ports and their kinds, environment, recommended GPUs and "
        "disk) shipped with the Master and added by its operator. Start one with "
        "'idlegrid rent OFFER --template NAME' or 'idlegrid workload submit --template NAME'.",
    )
    t_sub = p.add_subparsers(dest="template_command", required=True, metavar="{list,show}")
    listing = make(t_sub, "list", "list the templates", "The templates this grid offers, by name.")
    connection_options(listing)
    listing.set_defaults(func=run_list)
    show = make(t_sub, "show", "show one template", "A template's fields and the workload spec it launches.")
    show.add_argument("name", metavar="NAME", help="the template's name, e.g. jupyter")
    connection_options(show)
    show.set_defaults(func=run_show)


def add_launch_options(p: argparse.ArgumentParser) -> None:
    """``--template`` and ``--link`` for a command that submits a workload (submit, rent)."""
    p.add_argument(
        "--template",
        metavar="NAME",
        help="start from this launch template ('idlegrid template list'); the other flags override its fields, and "
        "the command waits for its link and prints it (default: none)",
    )
    p.add_argument(
        "--link",
        action="append",
        metavar="PORT[:public]",
        help="serve this container port as an HTTPS link (declared as a port too); ':public' lets anyone with the URL "
        "open it, otherwise only you (repeatable; default: the template's)",
    )
    p.add_argument(
        "--wait-link-s",
        type=float,
        metavar="SECONDS",
        help=f"wait this long for the links to answer and print them (default: {LINK_WAIT_S:.0f} with --template or "
        "--link, else do not wait)",
    )


def parse_link(text: str) -> SpecJson:
    port_text, _, flag = text.partition(":")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or flag not in ("", "public"):
        raise BadLink(f"--link {text!r}: write it as PORT or PORT:public, the port 1 to 65535")
    return {"port": int(port_text), "kind": "http", "public": flag == "public"}


def template_base(args: argparse.Namespace) -> SpecJson:
    """The spec the template launches (``{}`` without ``--template``)."""
    name = getattr(args, "template", None)
    if not name:
        return {}
    return dict(api_client(args)[0].template(name)["spec"])


def apply_links(args: argparse.Namespace, spec: SpecJson) -> None:
    """``--link`` flags over the spec: each port declared, and linked as asked (replacing that port's link)."""
    for link in map(parse_link, getattr(args, "link", None) or []):
        ports = list(spec.get("ports") or [])
        if link["port"] not in ports:
            ports.append(link["port"])
        spec["ports"] = ports
        spec["links"] = [v for v in spec.get("links") or [] if v["port"] != link["port"]] + [link]


def link_wait_s(args: argparse.Namespace) -> float:
    if getattr(args, "wait_link_s", None) is not None:
        return float(args.wait_link_s)
    return LINK_WAIT_S if getattr(args, "template", None) or getattr(args, "link", None) else 0.0


def print_links_when_up(client: Any, workload: AnswerJson, wait_s: float, out: Any = sys.stdout) -> bool:
    """Wait (at most ``wait_s``) for the workload to run and each of its links to answer, then print them: a private
    link with a URL that opens it in a browser (a link token, valid for the console's browser time). False, with one
    line on stderr naming the link and what to check, when they did not answer in time or the workload ended; True
    when they were printed or there was nothing to wait for."""
    links = client.workload_links(workload["id"])["items"]
    if not links or wait_s <= 0:
        return True
    workload_id = workload["id"]
    print(f"waiting up to {wait_s:.0f} s for {workload_id} to run and its links to answer...", file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait_s
    state, silent = workload["state"], links
    while time.monotonic() < deadline:
        state = client.workload(workload_id)["state"]
        if state in FINAL_WORKLOAD_STATES:
            print(
                f"idlegrid: {workload_id} is {state}, so its links are closed: 'idlegrid workload get {workload_id}' says why",
                file=sys.stderr,
            )
            return False
        silent = [link for link in links if not _answers(client, link)] if state == WorkloadState.RUNNING else links
        if not silent:
            break
        time.sleep(POLL_S)
    else:
        print(_no_answer(workload_id, state, silent[0], wait_s), file=sys.stderr)
        return False
    for link in links:
        if link["public"]:
            print(f"link (port {link['port']}, public): {link['url']}", file=out)
        else:
            minted = client.mint_link_token(workload_id, link["port"])
            print(f"link (port {link['port']}, private): {link['url']}", file=out)
            print(f"  open in a browser: {minted['url']}?idlegrid_token={minted['token']}", file=out)
    out.flush()
    return True


def _no_answer(workload_id: str, state: str, link: AnswerJson, wait_s: float) -> str:
    """One line: which link did not answer in time, and where to look."""
    said = f"idlegrid: the link {link['url']} (port {link['port']}) did not answer within {wait_s:.0f} s"
    if state != WorkloadState.RUNNING:
        return f"{said}: {workload_id} is still {state}; 'idlegrid workload explain {workload_id}' says what it waits for"
    return (
        f"{said}: {workload_id} runs, but nothing answers HTTP on port {link['port']} in it; check what it serves with "
        f"'idlegrid workload logs {workload_id}' (the wait was --wait-link-s)"
    )


def _answers(client: Any, link: AnswerJson) -> bool:
    """Whether the container answers on the link: any answer but the Master's own 502/503 (not reachable yet)."""
    import urllib.error
    import urllib.request

    headers = {} if link["public"] else {"Authorization": f"Bearer {client.api_key}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(link["url"], headers=headers), timeout=10):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code not in (502, 503)
    except OSError:
        return False


def run_list(args: argparse.Namespace) -> int:
    answer = api_client(args)[0].templates()
    if args.json:
        _json(answer)
        return 0
    rows = [
        [t["name"], t["title"], str(t["gpus"]), _ports(t), f"{t['disk_gib']} GiB" if t["disk_gib"] else "-", t["source"]]
        for t in answer["items"]
    ]
    print(table(("NAME", "TITLE", "GPUS", "PORTS", "DISK", "SOURCE"), rows) if rows else "no templates")
    return 0


def run_show(args: argparse.Namespace) -> int:
    try:
        t = api_client(args)[0].template(args.name)
    except ApiError as exc:
        print(f"idlegrid: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _json(t)
        return 0
    recommended = t["recommended_models"]
    lines = [
        f"name:         {t['name']}  ({t['source']})",
        f"title:        {t['title']}",
        f"image:        {t['image']}",
        f"command:      {' '.join(t['command']) or '(the image default)'}",
        f"ports:        {_ports(t) or '-'}",
        f"env:          {', '.join(f'{k}={v}' for k, v in t['env'].items()) or '-'}",
        f"gpus:         {t['gpus']}" + (f"  (recommended: {', '.join(recommended)})" if recommended else ""),
        f"min VRAM:     {t['min_vram_gib']} GiB" if t["min_vram_gib"] else "min VRAM:     -",
        f"disk:         {t['disk_gib']} GiB" if t["disk_gib"] else "disk:         -",
        "",
        t["description"],
    ]
    print("\n".join(lines))
    return 0


def _ports(t: AnswerJson) -> str:
    return ", ".join(f"{p['port']}/{p['kind']}" + (" public" if p["public"] else "") for p in t["ports"])


def _json(answer: Any) -> None:
    import json

    json.dump(answer, sys.stdout, indent=2)
    print()
