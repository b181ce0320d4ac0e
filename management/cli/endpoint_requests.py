"""``idlegrid endpoint run|request|health``: requests to a serverless endpoint (docs/endpoints.md, "The request
routes"), through the management API.

  idlegrid endpoint run ID --input '{"prompt": "hi"}'        queue it; prints the request's id
  idlegrid endpoint run ID --input @input.json --sync       wait for the output (90 s at most, --wait S to change)
  idlegrid endpoint request status|stream|cancel|retry ID REQUEST_ID
  idlegrid endpoint health ID                               requests by state, workers

They call with the caller's API key (as every command does), or with one of the endpoint's invocation keys: --key KEY,
or IDLEGRID_ENDPOINT_KEY. A request that ends otherwise than completed makes the command exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from management.cli.connection import api_client, connection_options, resolve_api, show
from management.cli.workloads import BadSpec
from management.client.api import AnswerJson, ApiClient

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]

KEY_ENV = "IDLEGRID_ENDPOINT_KEY"
MAX_WAIT_S = 300.0  # the API's bound on a runsync's wait
STREAM_POLL_S = 20.0  # each stream read waits this long for the next output
ENDED_BADLY = ("FAILED", "CANCELLED", "TIMED_OUT")


def add_parsers(e_sub: argparse._SubParsersAction, make: Parser) -> None:
    """``run``, ``request`` and ``health`` under ``idlegrid endpoint``."""
    run = make(
        e_sub,
        "run",
        "send a request to an endpoint",
        "Queue a request for the endpoint's workers and print its id; with --sync, wait for its output and print it. "
        "Examples:\n"
        '  idlegrid endpoint run ep-... --input \'{"prompt": "hi"}\'\n'
        "  idlegrid endpoint run ep-... --input @input.json --sync --wait 30",
    )
    run.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    run.add_argument(
        "--input",
        required=True,
        metavar="JSON|@FILE",
        help="the handler's input: JSON, or @FILE to read it from a file (@- for stdin); at most 1 MiB",
    )
    run.add_argument("--sync", action="store_true", help="wait for the output and print it (default: queue and return)")
    run.add_argument(
        "--wait",
        type=float,
        default=90.0,
        metavar="S",
        help=f"with --sync, wait at most this many seconds, up to {MAX_WAIT_S:g} (default: %(default)g)",
    )
    run.add_argument("--webhook", metavar="URL", help="POST the request's status there once it ends (default: none)")
    _key_options(run)
    run.set_defaults(func=_run_run)

    request = make(
        e_sub,
        "request",
        "follow, cancel or retry a request",
        "A request's status (and its output once done), its streamed outputs, cancel, retry.",
    )
    r_sub = request.add_subparsers(dest="endpoint_request_command", required=True, metavar="{status,stream,cancel,retry}")
    for name, summary, detail, func in [
        ("status", "a request's status", "Show a request's status, and its output once completed.", _run_status),
        (
            "stream",
            "a request's streamed outputs",
            "Print a request's partial outputs (one JSON value a line) as its handler yields them, until it ends.",
            _run_stream,
        ),
        ("cancel", "cancel a request", "Cancel a queued or running request (its worker drops it).", _run_cancel),
        ("retry", "run a request again", "Queue a failed, timed-out or cancelled request again.", _run_retry),
    ]:
        p = make(r_sub, name, summary, detail)
        p.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
        p.add_argument("request_id", metavar="REQUEST_ID", help="the request's id, req-…")
        _key_options(p)
        p.set_defaults(func=func)

    health = make(e_sub, "health", "an endpoint's requests and workers", "How many requests are in each state, and the workers.")
    health.add_argument("endpoint_id", metavar="ID", help="the endpoint's id, ep-…")
    _key_options(health)
    health.set_defaults(func=_run_health)


def _key_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key",
        metavar="KEY",
        help=f"one of the endpoint's invocation keys, igek_… (default: ${KEY_ENV}, else the API key)",
    )
    connection_options(p)


def _client(args: argparse.Namespace, *, timeout_s: float | None = None) -> Any:
    """The API client, with the invocation key when one is given, else the caller's API key."""
    key = args.key or os.environ.get(KEY_ENV)
    if key:
        client = ApiClient(resolve_api(args, os.environ), key)
    else:
        client, _ = api_client(args)
    if timeout_s is not None:
        client.timeout_s = timeout_s
    return client


def read_input(given: str) -> Any:
    """``--input``: JSON, or ``@FILE`` (``@-``: stdin) holding JSON."""
    text, where = given, "--input"
    if given.startswith("@"):
        where = given[1:] or "-"
        try:
            text = sys.stdin.read() if where == "-" else Path(where).read_text()
        except OSError as exc:
            raise BadSpec(f"--input {given}: cannot read it: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        hint = "" if given.startswith("@") else " (quote it for the shell, or give @FILE)"
        raise BadSpec(f"{where}: not JSON: {exc}{hint}") from None


def _run_run(args: argparse.Namespace) -> int:
    value = read_input(args.input)
    if not args.sync:
        answer = _client(args).run_endpoint(args.endpoint_id, value, webhook=args.webhook)
        return show(args, answer, lambda r: _queued(args.endpoint_id, r))
    wait = min(max(args.wait, 0.0), MAX_WAIT_S)
    answer = _client(args, timeout_s=wait + 30).run_endpoint_sync(args.endpoint_id, value, wait_s=wait, webhook=args.webhook)
    show(args, answer, lambda r: _status(args.endpoint_id, r, waited=wait))
    return 1 if answer["status"] in ENDED_BADLY else 0


def _run_status(args: argparse.Namespace) -> int:
    return show(args, _client(args).endpoint_request(args.endpoint_id, args.request_id), lambda r: _status(args.endpoint_id, r))


def _run_stream(args: argparse.Namespace) -> int:
    client = _client(args, timeout_s=STREAM_POLL_S + 30)
    after = -1  # from the first output, whoever read before
    while True:
        answer = client.stream_endpoint_request(args.endpoint_id, args.request_id, after=after, wait_s=STREAM_POLL_S)
        for item in answer["stream"]:
            print(json.dumps(item if args.json else item["output"]), flush=True)
            after = max(after, item["seq"])
        if answer["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            break
    if not args.json:
        print(f"request {args.request_id} {answer['status']}", file=sys.stderr)
    return 1 if answer["status"] in ENDED_BADLY else 0


def _run_cancel(args: argparse.Namespace) -> int:
    answer = _client(args).cancel_endpoint_request(args.endpoint_id, args.request_id)
    return show(args, answer, lambda r: f"request {r['id']} cancelled")


def _run_retry(args: argparse.Namespace) -> int:
    answer = _client(args).retry_endpoint_request(args.endpoint_id, args.request_id)
    return show(
        args, answer, lambda r: f"request {r['id']} queued again (attempt {r['attempt']})\n" + _follow(args.endpoint_id, r)
    )


def _run_health(args: argparse.Namespace) -> int:
    return show(args, _client(args).endpoint_health(args.endpoint_id), _health)


# --- output ------------------------------------------------------------------------------------------


def _follow(endpoint_id: str, r: AnswerJson) -> str:
    return f"follow it: idlegrid endpoint request status {endpoint_id} {r['id']}"


def _queued(endpoint_id: str, r: AnswerJson) -> str:
    return f"request {r['id']} queued\n" + _follow(endpoint_id, r)


def _seconds(ms: int | None) -> str | None:
    return None if ms is None else f"{ms / 1000:.3f} s"


def _status(endpoint_id: str, r: AnswerJson, *, waited: float | None = None) -> str:
    lines: list[tuple[str, Any]] = [
        ("request", r["id"]),
        ("status", r["status"] + (f" (attempt {r['attempt']})" if r["attempt"] > 1 else "")),
        ("queued for", _seconds(r.get("delayTime"))),
        ("ran for", _seconds(r.get("executionTime"))),
        ("progress", json.dumps(r["progress"]) if "progress" in r else None),
        ("error", r.get("error")),
    ]
    text = "\n".join(f"{k + ':':<12}{v}" for k, v in lines if v is not None)
    if "output" in r:
        text += "\noutput:\n" + json.dumps(r["output"], indent=2, sort_keys=True)
    detail = r.get("errorDetail") or {}
    if detail.get("traceback"):
        text += "\ntraceback:\n" + detail["traceback"].rstrip()
    if r["status"] in ("IN_QUEUE", "IN_PROGRESS"):
        if waited is not None:
            text += f"\nnot done after {waited:g} s; "
        else:
            text += "\n"
        text += _follow(endpoint_id, r)
    return text


def _health(h: AnswerJson) -> str:
    jobs, workers = h["jobs"], h["workers"]
    return (
        f"requests: {jobs['inQueue']} in queue, {jobs['inProgress']} in progress, {jobs['completed']} completed, "
        f"{jobs['failed']} failed, {jobs['cancelled']} cancelled, {jobs['timedOut']} timed out\n"
        f"workers:  {workers['ready']} ready ({workers['running']} running, {workers['idle']} idle)"
    )


__all__ = ["KEY_ENV", "add_parsers", "read_input"]
