"""``idlegrid alert ...``: what fires, from the command line.

  idlegrid alert list [--phase firing|pending] [--severity S] [--rule NAME] [--recent N]
  idlegrid alert rules                         the rules in force and where each comes from (file | api)
  idlegrid alert rule set NAME --metric M --op '>' --threshold X [--for 2m] [...]   (the operator)
  idlegrid alert rule delete NAME              an API-put rule goes; the rules file's of that name applies again
  idlegrid alert silence --for 2h [--rule R] [--subject S] [--label K=V ...] [--comment TEXT]   (the operator)
  idlegrid alert silences [--all]              active silences (--all: expired ones too)
  idlegrid alert unsilence ID                  expire a silence now
  idlegrid alert webhook add URL | list | remove ID

Each key sees what its account may (docs/monitoring.md, "Who sees which alert"): the operator everything, a provider
its hosts' and GPUs' alerts, a renter its workloads'. Tables by default, ``--json`` for the API's JSON.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from management.cli.connection import Parser, api_client, connection_options, mapping_text, show, table, when
from management.cli.hosts import duration_s
from management.client.api import AnswerJson

RECENT_SHOWN = 10


def _label(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not a label matcher: write NAME=VALUE, e.g. provider=acme")
    return name, value


def _seconds(text: str, *, positive: bool = False) -> float:
    """A duration as the other commands take it (``duration_s``: 90s, 5m, 2h, 1d), never "none"."""
    try:
        seconds = duration_s(text)
    except argparse.ArgumentTypeError:
        seconds = None
    if seconds is None or (positive and seconds <= 0):
        example = "a silence needs a duration, e.g. 30m, 2h, 1d" if positive else "write a duration, e.g. 0, 90s, 5m, 2h"
        raise argparse.ArgumentTypeError(f"{text!r}: {example}")
    return seconds


def _duration(text: str) -> float:
    return _seconds(text, positive=True)


def _value(value: object) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _alert_rows(alerts: Sequence[AnswerJson]) -> str:
    """One line an alert: its host and owner (provider, else renter) out of its labels; ``--json`` shows them all."""
    return table(
        ["PHASE", "RULE", "SUBJECT", "VALUE", "SINCE", "FIRED", "HOST", "OWNER"],
        [
            [
                a["phase"],
                a["rule"],
                a["subject"],
                _value(a["value"]),
                when(a["since"]),
                when(a["fired_at"]),
                a["labels"].get("agent_id") or None,
                a["labels"].get("provider") or a["labels"].get("renter") or None,
            ]
            for a in alerts
        ],
    )


def _transition_rows(transitions: Sequence[AnswerJson]) -> str:
    return table(
        ["AT", "PHASE", "SEVERITY", "RULE", "SUBJECT", "VALUE", "SUMMARY"],
        [
            [when(t["at"]), t["phase"], t["severity"], t["rule"], t["subject"], _value(t["value"]), t["summary"]]
            for t in transitions
        ],
    )


def _listing(recent: int) -> Callable[[AnswerJson], str]:
    def render(body: AnswerJson) -> str:
        active = body["items"]
        parts = [_alert_rows(active) if active else "no alert is pending or firing"]
        shown = body["recent"][:recent]
        if shown:
            heading = f"recent transitions (newest first, {len(shown)} of {len(body['recent'])}):"
            parts.append(heading + "\n" + _transition_rows(shown))
        return "\n\n".join(parts)

    return render


def _rule_rows(body: AnswerJson) -> str:
    def condition(r: AnswerJson) -> str:
        text = f"{r['metric']} {r['op']} {_value(r['threshold'])}"
        return text + (f" for {r['for_s']:g}s" if r["for_s"] else "")

    def clears(r: AnswerJson) -> str:
        if r["clear_threshold"] is None and not r["clear_for_s"]:
            return "-"
        threshold = r["clear_threshold"] if r["clear_threshold"] is not None else r["threshold"]
        return f"past {_value(threshold)}" + (f" for {r['clear_for_s']:g}s" if r["clear_for_s"] else "")

    return table(
        ["NAME", "CONDITION", "CLEARS", "SEVERITY", "SCOPE", "FAULT", "SOURCE"],
        [
            [r["name"], condition(r), clears(r), r["severity"], r["scope"], "yes" if r["fault"] else "", r["source"]]
            for r in body["items"]
        ],
    )


def _silence_rows(silences: Sequence[AnswerJson]) -> str:
    if not silences:
        return "no silence"
    return table(
        ["ID", "RULE", "SUBJECT", "LABELS", "EXPIRES", "BY", "COMMENT"],
        [
            [
                s["id"],
                s["rule"],
                s["subject"],
                mapping_text(s["labels"]),
                when(s["expires_at"]),
                s["created_by"],
                s["comment"] or None,
            ]
            for s in silences
        ],
    )


def _webhook_rows(webhooks: Sequence[AnswerJson]) -> str:
    if not webhooks:
        return "no webhook"
    return table(["ID", "URL", "OWNER", "CREATED"], [[w["id"], w["url"], w["owner"], when(w["created_at"])] for w in webhooks])


def _created_webhook(body: AnswerJson) -> str:
    return (
        _webhook_rows([body]) + f"\n\nsecret: {body['secret']}\n"
        "Keep it: it is shown this once. Each delivery carries X-Idlegrid-Signature: sha256=HMAC-SHA256(secret, body)."
    )


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``alert`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    alert = parser(
        sub,
        "alert",
        "alerts: what fires, rules, silences, webhooks",
        "What fires now and what fired lately; the rules in force; silences (the operator's); webhooks.",
    )
    a_sub = alert.add_subparsers(
        dest="alert_command", required=True, metavar="{list,rules,rule,silence,silences,unsilence,webhook}"
    )

    listing = parser(a_sub, "list", "pending and firing alerts", "Pending and firing alerts you may see, and recent transitions.")
    listing.add_argument("--phase", choices=("pending", "firing"), help="only alerts in this phase (default: both)")
    listing.add_argument("--severity", choices=("info", "warning", "critical"), help="only this severity (default: every one)")
    listing.add_argument("--rule", metavar="NAME", help="only this rule's alerts (default: every rule's)")
    listing.add_argument(
        "--recent", type=int, default=RECENT_SHOWN, metavar="N", help="recent transitions shown (default: %(default)s)"
    )
    connection_options(listing)
    listing.set_defaults(func=_run_list)

    rules = parser(
        a_sub, "rules", "the rules in force", "The alert rules in force: the rules file's, and those put through the API."
    )
    connection_options(rules)
    rules.set_defaults(func=_run_rules)

    rule = parser(a_sub, "rule", "add, replace or delete a rule (the operator)", "Rules put through the API, beside the file's.")
    r_sub = rule.add_subparsers(dest="rule_command", required=True, metavar="{set,delete}")
    put = parser(
        r_sub,
        "set",
        "add or replace a rule",
        "Add a rule, or replace the one of that name (a file's rule too, until this one is deleted). It fires when "
        "`METRIC OP THRESHOLD` has held --for; it clears once `METRIC OP CLEAR_THRESHOLD` no longer holds for "
        "--clear-for (hysteresis). docs/monitoring.md lists every metric a rule can watch.\n"
        "  idlegrid alert rule set hot_gpu --metric gpu.temperature_c --op '>' --threshold 80 --for 5m "
        "--clear-threshold 75 --severity warning --summary 'GPU over 80 °C for 5 minutes'",
    )
    put.add_argument("name", metavar="NAME", help="lowercase letters, digits and _")
    put.add_argument("--metric", required=True, help="what is watched, e.g. gpu.temperature_c")
    put.add_argument("--op", required=True, choices=(">", ">=", "<", "<=", "==", "!="), help="the comparison")
    put.add_argument("--threshold", type=float, required=True, help="the value that breaches")
    put.add_argument(
        "--for", dest="for_s", type=_seconds, default=0.0, metavar="DURATION", help="held this long first (default: 0, at once)"
    )
    put.add_argument(
        "--clear-threshold", type=float, metavar="X", help="a firing alert clears past this (default: the threshold)"
    )
    put.add_argument("--clear-for", type=_seconds, default=0.0, metavar="DURATION", help="... for this long (default: 0)")
    put.add_argument("--severity", choices=("info", "warning", "critical"), default="warning", help="(default: %(default)s)")
    put.add_argument(
        "--scope", default="gpu", help="what one alert is about: gpu, host, workload, fleet... (default: %(default)s)"
    )
    put.add_argument("--fault", action="store_true", help="while firing, the GPU is marked faulty (default: not)")
    put.add_argument("--summary", default="", help="for the person who gets it (default: none)")
    connection_options(put)
    put.set_defaults(func=_run_rule_set)
    delete = parser(r_sub, "delete", "delete a rule put through the API", "The rules file's rule of that name applies again.")
    delete.add_argument("name", metavar="NAME")
    connection_options(delete)
    delete.set_defaults(func=_run_rule_delete)

    silence = parser(
        a_sub,
        "silence",
        "hold back notifications (the operator)",
        "Hold back the notifications of the alerts that every given matcher matches, until the silence expires. "
        "The alerts still fire and resolve as events.\n"
        "  idlegrid alert silence --for 2h --rule gpu_overheating --label provider=acme --comment 'cooling repaired'",
    )
    silence.add_argument("--for", dest="duration", type=_duration, required=True, metavar="DURATION", help="e.g. 30m, 2h, 1d")
    silence.add_argument("--rule", metavar="NAME", help="only this rule's alerts (default: any rule's)")
    silence.add_argument("--subject", metavar="ID", help="only alerts about this GPU, host, relay, workload... (default: any)")
    silence.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a label to match, repeatable (default: none)",
    )
    silence.add_argument("--comment", default="", help="why, for the next person on call (default: none)")
    connection_options(silence)
    silence.set_defaults(func=_run_silence)

    silences = parser(a_sub, "silences", "the silences", "Active silences (with --all, expired ones too).")
    silences.add_argument("--all", action="store_true", help="expired silences too (default: active ones only)")
    connection_options(silences)
    silences.set_defaults(func=_run_silences)

    unsilence = parser(a_sub, "unsilence", "expire a silence now", "Expire a silence now: notifications flow again.")
    unsilence.add_argument("silence", metavar="ID")
    connection_options(unsilence)
    unsilence.set_defaults(func=_run_unsilence)

    webhook = parser(a_sub, "webhook", "where alerts are posted", "Webhooks your alerts are posted to (signed, retried).")
    w_sub = webhook.add_subparsers(dest="webhook_command", required=True, metavar="{add,list,remove}")
    add = parser(w_sub, "add", "add a webhook", "Post your alerts to URL; the signing secret is printed once.")
    add.add_argument("url", metavar="URL")
    connection_options(add)
    add.set_defaults(func=_run_webhook_add)
    shown = parser(w_sub, "list", "your webhooks", "Your webhooks (the operator: every one).")
    connection_options(shown)
    shown.set_defaults(func=_run_webhook_list)
    remove = parser(w_sub, "remove", "remove a webhook", "Stop posting to a webhook.")
    remove.add_argument("webhook", metavar="ID")
    connection_options(remove)
    remove.set_defaults(func=_run_webhook_remove)


def _run_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    body = client.alerts(rule=args.rule, phase=args.phase, severity=args.severity)
    return show(args, body, _listing(max(0, args.recent)))


def _run_rules(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.alert_rules(), _rule_rows)


def _run_rule_set(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    spec = {
        "metric": args.metric,
        "op": args.op,
        "threshold": args.threshold,
        "for_s": args.for_s,
        "clear_threshold": args.clear_threshold,
        "clear_for_s": args.clear_for,
        "severity": args.severity,
        "scope": args.scope,
        "fault": args.fault,
        "summary": args.summary,
    }
    return show(args, client.put_alert_rule(args.name, spec), lambda r: _rule_rows({"items": [r]}))


def _run_rule_delete(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    body = client.delete_alert_rule(args.name)

    def human(b: AnswerJson) -> str:
        again = b["applies_now"]
        return f"rule {b['deleted']} deleted" + (
            "; the rules file's applies again:\n" + _rule_rows({"items": [again]}) if again else ""
        )

    return show(args, body, human)


def _run_silence(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    body = client.silence(args.duration, rule=args.rule, subject=args.subject, labels=dict(args.label), comment=args.comment)
    return show(args, body, lambda s: _silence_rows([s]))


def _run_silences(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.silences(include_expired=args.all), lambda b: _silence_rows(b["items"]))


def _run_unsilence(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.expire_silence(args.silence), lambda s: _silence_rows([s]))


def _run_webhook_add(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.add_webhook(args.url), _created_webhook)


def _run_webhook_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    every = {"items": client.list("/api/v1/webhooks")}  # the list is paged: every page, for the operator's many
    return show(args, every, lambda b: _webhook_rows(b["items"]))


def _run_webhook_remove(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    client.remove_webhook(args.webhook)
    print(f"webhook {args.webhook} removed")
    return 0
