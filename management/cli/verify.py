"""``idlegrid host verify`` and ``idlegrid host verifications``: measured verification from the command line.

  idlegrid host verify HOST [--gpu UUID ...]   an operator: benchmark the host's GPUs now, with a fresh challenge
  idlegrid host verifications HOST             each GPU's latest verification, why, and its runs with their figures

What a run proves: docs/verification.md. Tables by default, ``--json`` for the API's JSON.
"""

from __future__ import annotations

import argparse

from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.client.api import AnswerJson

FIGURES = (("bf16_tflops", "BF16"), ("fp32_tflops", "FP32"), ("memory_bandwidth_gbs", "MEM GB/S"), ("h2d_gbs", "H2D GB/S"))


def add_verification_parsers(h_sub: argparse._SubParsersAction, parser: Parser) -> None:
    verify = parser(
        h_sub,
        "verify",
        "benchmark a host's GPUs now (operator)",
        "Send a fresh challenge to each GPU of HOST (or those named): the GPU must compute a seeded matrix product in "
        "the time its claimed model takes. A GPU a renter holds is never benchmarked.",
    )
    verify.add_argument("host", metavar="HOST", help="the host's agent id")
    verify.add_argument("--gpu", action="append", default=[], metavar="UUID", help="a GPU to verify (default: all)")
    connection_options(verify)
    verify.set_defaults(func=_run_verify)

    history = parser(
        h_sub,
        "verifications",
        "each GPU's measured verification and its runs",
        "Each GPU of HOST with its latest verification (verified, simulated, unmeasured, failed and why) and its runs.",
    )
    history.add_argument("host", metavar="HOST", help="the host's agent id")
    connection_options(history)
    history.set_defaults(func=_run_history)


def started_text(body: AnswerJson) -> str:
    started = body["challenges"]
    if not started:
        return f"{body['agent_id']}: every GPU is being verified already"
    return (
        f"{body['agent_id']}: {len(started)} challenge(s) sent; `idlegrid host verifications {body['agent_id']}` shows the result"
    )


def history_text(body: AnswerJson) -> str:
    parts = []
    for gpu in body["gpus"]:
        latest = gpu["verification"]
        head = f"{gpu['uuid']} ({gpu['model'] or 'unknown model'}): {latest['label']}"
        if latest["reason"]:
            head += f"\n  {latest['reason']}"
        rows = [
            [when(run["at"]), run["status"] + (f": {run['code']}" if run["code"] else ""), _seconds(run["commit_s"])]
            + [(run["figures"] or {}).get(key) for key, _ in FIGURES]
            for run in gpu["runs"][:10]
        ]
        runs = table(["WHEN", "RESULT", "ANSWER IN", *(label for _, label in FIGURES)], rows) if rows else "  no run yet"
        parts.append(head + "\n\n" + runs)
    return "\n\n".join(parts) or f"{body['agent_id']} reports no GPU"


def _seconds(value: object) -> str | None:
    return f"{value:.2f} s" if isinstance(value, (int, float)) else None


def _run_verify(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.verify(args.host, args.gpu), started_text)


def _run_history(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.verifications(args.host), history_text)
