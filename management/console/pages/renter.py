"""The renter's pages: launch a workload (or rent an offer: the offers are pages/offers.py), my workloads (state,
events, why one waits, terms and charge, stop, port-forward, live logs, a terminal) and billing (balance, spend over
time, ledger).

Each handler names what it does ((Resource, Action) through ``session.signed_in``), reads its form or query, makes
its call on the façade and renders a template; a renter only ever sees its own workloads and money (Scope.owner).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from aiohttp import web

from common.errors import Conflict, NotFound
from common.output import last_lines
from common.overlay import replica_address
from management.access_control import AccountRole, Action, Resource, acting_account
from management.console import session
from management.console.forms import FormErrors, amount, environment, integer, number, text, word
from management.console.nav import NavItem
from management.console.pages.billing_settings import settings_of
from management.console.pages.billing_topup import billing_csp
from management.console.pages.disputes import rental_disputes
from management.console.rendering import TemplateContext, page
from management.console.terminal import serve_logs, serve_terminal
from management.console.workload_form import (
    PROCESS_IMAGE,
    RESTART_HINT,
    RESTART_LABELS,
    SECRET_ROWS,
    form_from_spec,
    gang_fields,
    link_fields,
    process_allowed,
    refused_field,
    registry_fields,
    secret_env,
    with_registry_auth,
)
from management.console.workload_storage import (
    LOCATION_HELP,
    storage_choices,
    storage_section,
    transfer_event,
    with_storage,
)
from management.http.errors import validation_message
from management.http.keys import SERVICES_KEY
from management.http.paging import decode_cursor, encode_cursor
from management.http.schemas import PageQuery
from management.market.money import MICRO, BadAmount, format_amount, parse_amount
from management.market.offers import Offer
from management.monitoring.history import TelemetryHistory
from management.payments.records import TopupRecord
from management.services.billing import SpendOverTime
from management.services.market import FundsDetail, PaymentRequired
from management.services.workloads import WorkloadKey, WorkloadRuns
from management.views.workloads import explanation_view, workload_view
from management.workloads.explain_text import render_explanation
from management.workloads.spec import InvalidWorkloadSpec
from management.workloads.states import FINAL_WORKLOAD_STATES, WORKLOAD_STATES, WorkloadState
from master.port import MAX_GPUS_PER_REPLICA, MAX_REPLICAS, KeptOutput, RentalTerms, SpecJson, WorkloadRecord, WorkloadSpec

WORKLOADS_PER_PAGE = 25
LEDGER_PER_PAGE = 50
TOPUPS_SHOWN = 10
DISPUTES_SHOWN = 5  # the billing page's latest disputes; the disputes page lists them all
TOPUP_WAIT_S = 120.0  # the billing page reloads itself this long while a top-up just paid waits for its webhook
LIVE_STATE_KEY = web.RequestKey("console_workload_state", str)
RENTAL_KINDS = {
    "on_demand": "On demand (runs until stopped)",
    "interruptible": "Interruptible (your bid; may be preempted)",
    "reserved": "Reserved (a period prepaid at the reserved price; never preempted)",
}
MAX_RESERVED_HOURS = 366 * 24  # RentalTerms.reserved_s: at least an hour, at most 366 days


# --- launching ---------------------------------------------------------------------------------------------------


def workload_spec(
    form: Any, errors: FormErrors, *, offer: Offer | None, secret_names: Collection[str] = ()
) -> WorkloadSpec | None:
    """The WorkloadSpec the launch (or rent) form describes; None with ``errors`` filled when it describes none.
    ``secret_names``: the account's, which the form's secret variables may name."""
    name = text(form, "name", max_length=63)
    if not name:
        errors.add("name", "name: give the workload a name (lowercase letters, digits and -)")
    image = text(form, "image", max_length=512)
    if not image:
        errors.add("image", "image: the container image to run (e.g. docker.io/library/python:3.12)")
    try:
        command = shlex.split(text(form, "command"))
    except ValueError as exc:
        errors.add("command", f"command: {exc} (quote arguments as in a shell)")
        command = []
    high = offer.num_gpus if offer is not None and offer.num_gpus > 0 else MAX_GPUS_PER_REPLICA
    gpus = integer(form, "gpus", errors, label="GPUs", low=1, high=high, default=1)
    model = word(form, "model", errors, label="GPU model") if offer is None else None
    kind = text(form, "kind") or "on_demand"
    rental: SpecJson = {"kind": kind}
    if kind not in RENTAL_KINDS:
        errors.add("kind", f"rental: one of {', '.join(RENTAL_KINDS)}")
    elif kind == "interruptible":
        bid = amount(form, "bid", errors, label="bid")
        if bid is None and "bid" not in errors:
            errors.add("bid", "bid: an interruptible rental needs a bid per GPU-hour")
        rental["bid"] = bid
    else:
        max_price = amount(form, "max_price", errors, label="max price")
        if max_price is not None:
            rental["max_price"] = max_price
    if kind == "reserved":
        reserved_h = number(form, "reserved_hours", errors, label="reserved period", low=1, high=MAX_RESERVED_HOURS)
        if reserved_h is None and "reserved_hours" not in errors:
            errors.add("reserved_hours", "reserved period: a reserved rental prepays a period; give it in hours (at least 1)")
        rental["reserved_s"] = reserved_h * 3600 if reserved_h is not None else None
    if offer is not None:
        rental["offer"] = offer.id
    hours = number(form, "max_hours", errors, label="max duration", low=0.01, high=366 * 24)
    ports: list[int] = []
    for item in text(form, "ports").replace(",", " ").split():
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            errors.add("ports", f"ports: numbers from 1 to 65535, separated by commas (not {item[:20]!r})")
        elif int(item) not in ports:
            ports.append(int(item))
    links = link_fields(form, errors, ports)
    env = environment(form, "env", errors)
    secret_env(form, errors, env, secret_names)  # ${secret:NAME}, resolved on the host, never shown back
    gang = gang_fields(form, errors)
    disk = number(form, "disk_gib", errors, label="disk", low=1, high=1_000_000)
    if errors:
        return None
    raw = {
        "name": name,
        "image": image,
        "command": command,
        "env": env,
        "ports": ports,
        "links": links,
        **gang,
        "replica": {"gpus": gpus, "models": [model] if model else []},
        "constraints": {"allow_process_runtime": process_allowed(form), "min_disk_gib": disk or 0.0},
        "max_duration_s": hours * 3600 if hours is not None else None,
        "rental": rental,
    }
    try:
        return msgspec.convert(raw, WorkloadSpec)
    except msgspec.ValidationError as exc:
        message = validation_message(exc, "workload")
        field = message.split(":", 1)[0].split(".")[-1].split("[")[0]
        fields = ("name", "image", "command", "ports", "env", "links", "replicas", "restart_policy", "max_restarts")
        errors.add(field if field in fields else "form", message)
        return None


def cost_hint(
    price: int, gpus: int, *, funds: FundsDetail | None, priced_by: str, currency: str, reserved_hours: float | None = None
) -> str:
    """What the form's work costs per hour and how long the balance lasts at that rate, on top of what already runs
    (said when something does: "... lasts about 2.1 h at 6.00 USD per hour, this and the 1.20 of what already runs."):
    "Total 4.80 USD per hour for 2 GPU(s) at the on-demand price; your balance of 12.50 USD lasts about 2.6 h at that
    rate." Money before work: a renter sees both before renting. A reserved period is prepaid whole: its total is said
    too ("the reserved period of 24 h is prepaid: 57.60 USD")."""
    per_hour = price * gpus
    said = f"Total {format_amount(per_hour)} {currency} per hour for {gpus} GPU(s) at {priced_by}"
    if reserved_hours is not None:
        prepaid = price * gpus * int(reserved_hours * 3600) // 3600  # as the market charges it (rounded down)
        said += f"; the reserved period of {reserved_hours:g} h is prepaid: {format_amount(prepaid)} {currency}"
        if funds is not None and prepaid > funds.available:
            return f"{said}, more than your available balance of {format_amount(funds.available)} {currency}."
    if funds is None:
        return said + "."
    have = funds.available + funds.held
    rate = funds.running_per_hour + per_hour
    if rate <= 0:
        return f"{said}; your balance is {format_amount(have)} {currency}."
    lasts = f"your balance of {format_amount(have)} {currency} lasts about {have / rate:.1f} h at"
    if not funds.running_per_hour:
        return f"{said}; {lasts} that rate."
    others = format_amount(funds.running_per_hour)  # said, not silently added: the rate is more than the total above
    return f"{said}; {lasts} {format_amount(rate)} {currency} per hour, this and the {others} of what already runs."


async def _cost_hint(request: web.Request, offer: Offer | None, form: Any) -> str:
    """``cost_hint`` for the form as filled in: the offer's price (or the bid), else the grid's cheapest host."""
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    market = request.app[SERVICES_KEY].market
    gpus_text = str(form.get("gpus", "1") or "1")
    gpus = int(gpus_text) if gpus_text.isdigit() and 0 < int(gpus_text) <= MAX_GPUS_PER_REPLICA else 1
    replicas_text = str(form.get("replicas", "1") or "1")
    gpus *= int(replicas_text) if replicas_text.isdigit() and 0 < int(replicas_text) <= MAX_REPLICAS else 1
    bid_text = str(form.get("bid", "") or "")
    reserved = form.get("kind") == "reserved"
    hours = number(form, "reserved_hours", FormErrors(), label="", low=1, high=MAX_RESERVED_HOURS) if reserved else None
    if form.get("kind") == "interruptible" and bid_text:
        try:
            price, priced_by = parse_amount(bid_text), "your bid"
        except BadAmount:
            return ""
    elif offer is not None:
        price = offer.reserved_price if reserved else offer.price
        priced_by = "the offer's reserved price" if reserved else "the offer's on-demand price"
    else:
        terms = RentalTerms(kind="reserved", reserved_s=3600.0) if reserved else None
        cheapest = market.cheapest_price(WorkloadSpec(name="hint", image="hint", rental=terms))
        if cheapest is None:
            return ""
        kind = "reserved " if reserved else ""
        price, priced_by = cheapest[0], f"the cheapest host's {kind}price (the least it can cost)"
    funds = await market.funds(scope.owner) if scope.owner is not None else None
    return cost_hint(price, gpus, funds=funds, priced_by=priced_by, currency=market.currency, reserved_hours=hours)


async def _launch_form(
    request: web.Request, *, offer: Offer | None, form: Any, errors: FormErrors, clone_notes: list[str] | None = None
) -> web.Response:
    title = f"Rent {offer.model} on {offer.host}" if offer is not None else "Launch a workload"
    return await page(
        request, "renter/launch.html", status=400 if errors else 200, title=title, offer=offer, form=form,
        errors=errors, kinds=RENTAL_KINDS, money=format_amount, cost=await _cost_hint(request, offer, form),
        storage=await storage_choices(request, session.signed_in_account(request).id), location_help=LOCATION_HELP,
        restart_labels=RESTART_LABELS, restart_hint=RESTART_HINT, clone_notes=clone_notes or [],
        secret_rows=range(SECRET_ROWS), process_image=PROCESS_IMAGE,
    )  # fmt: skip


async def _form_spec(
    request: web.Request, account: str, form: Any, errors: FormErrors, *, offer: Offer | None
) -> WorkloadSpec | None:
    """The whole form's spec: the basics, inputs, outputs and checkpoint, the registry's credentials."""
    names = (await storage_choices(request, account)).secret_names
    spec = workload_spec(form, errors, offer=offer, secret_names=names)
    registry = registry_fields(form, errors, names)
    spec = await with_storage(request, account, spec, form, errors)
    return await with_registry_auth(request, account, spec, registry, errors)


async def launch_form(request: web.Request) -> web.Response:
    await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    return await _launch_form(request, offer=None, form={"gpus": "1", "kind": "on_demand"}, errors=FormErrors())


async def launch(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    form = await request.post()
    if form.get("action") == "price":  # "Update the total": the form priced as filled in, nothing submitted
        return await _launch_form(request, offer=None, form=form, errors=FormErrors())
    errors = FormErrors()
    spec = await _form_spec(request, scope.principal.account, form, errors, offer=None)
    if spec is None:
        return await _launch_form(request, offer=None, form=form, errors=errors)
    try:
        record = await request.app[SERVICES_KEY].workloads.submit_workload(acting_account(scope, None), spec)
    except (PaymentRequired, Conflict) as exc:  # money before work, or work that can never run here: said on the form
        errors.add("form", str(exc))
        return await _launch_form(request, offer=None, form=form, errors=errors)
    except InvalidWorkloadSpec as exc:  # the submit's own checks (a registry not allowed, a model not here): by field
        errors.add(refused_field(str(exc)), str(exc))
        return await _launch_form(request, offer=None, form=form, errors=errors)
    await session.flash(request, f"Submitted {record.id} ({spec.name}): {record.state}.")
    raise web.HTTPSeeOther(f"/console/workloads/{record.id}")


async def rent_form(request: web.Request) -> web.Response:
    await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    offer = await request.app[SERVICES_KEY].market.get_offer(request.match_info["offer_id"])
    form = {"gpus": "1", "kind": "on_demand", "allow_process_runtime": "on" if offer.runtime == "process" else ""}
    return await _launch_form(request, offer=offer, form=form, errors=FormErrors())


async def rent(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    market = request.app[SERVICES_KEY].market
    offer = await market.get_offer(request.match_info["offer_id"])
    form = await request.post()
    if form.get("action") == "price":  # "Update the total": the form priced as filled in, nothing rented
        return await _launch_form(request, offer=offer, form=form, errors=FormErrors())
    errors = FormErrors()
    spec = await _form_spec(request, scope.principal.account, form, errors, offer=offer)
    if spec is None:
        return await _launch_form(request, offer=offer, form=form, errors=errors)
    try:
        record = await market.rent_offer(acting_account(scope, None), offer.id, spec)
    except (PaymentRequired, Conflict) as exc:  # money before work, or an offer that cannot take it: said on the form
        errors.add("form", str(exc))
        return await _launch_form(request, offer=offer, form=form, errors=errors)
    except InvalidWorkloadSpec as exc:  # the submit's own checks (a registry not allowed, a model not here): by field
        errors.add(refused_field(str(exc)), str(exc))
        return await _launch_form(request, offer=offer, form=form, errors=errors)
    await session.flash(request, f"Rented {offer.id}: {record.id} ({spec.name}) is {record.state}.")
    raise web.HTTPSeeOther(f"/console/workloads/{record.id}")


# --- my workloads ------------------------------------------------------------------------------------------------


class WorkloadListQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    state: Annotated[str, msgspec.Meta(max_length=32)] = ""


async def workloads(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.READ)
    state = request.query.get("state", "")
    if state and state not in WORKLOAD_STATES:
        raise NotFound(f"no workload state {state!r}; one of {', '.join(WORKLOAD_STATES)}")
    query = WorkloadListQuery(state=state, limit=WORKLOADS_PER_PAGE, cursor=request.query.get("cursor") or None)
    listed = await request.app[SERVICES_KEY].workloads.list_workloads(
        owner=scope.owner, states=[state] if state else None, after=decode_cursor("console-workloads", query, WorkloadKey),
        limit=WORKLOADS_PER_PAGE,
    )  # fmt: skip
    next_url = None
    if listed.next_key is not None:
        next_url = request.rel_url.update_query(cursor=encode_cursor("console-workloads", query, listed.next_key))
    runs = await request.app[SERVICES_KEY].workloads.runs_of(listed.items, now=time.time())
    rows = [workload_row(w, runs[w.id]) for w in listed.items]
    return await page(
        request, "renter/workloads.html", title="My workloads", rows=rows, state=state, states=WORKLOAD_STATES,
        next_url=next_url, first_page=query.cursor is None, currency=request.app[SERVICES_KEY].market.currency,
    )  # fmt: skip


def duration(seconds: float) -> str:
    """A span as people read it: "45 s", "12 min", "3 h 05 min", "2 d 4 h"."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def workload_row(record: WorkloadRecord, runs: WorkloadRuns) -> TemplateContext:
    """One line of the workloads list: what it cost so far, where it ran, for how long (its rentals' charged time)."""
    hosts = runs.hosts
    return {
        "w": record, "charged": format_amount(runs.charged), "ran": None if runs.ran_s is None else duration(runs.ran_s),
        "host": hosts[0] if hosts else None, "more_hosts": len(hosts) - 1 if hosts else 0,
    }  # fmt: skip


async def workload(request: web.Request, *, template: str = "renter/workload.html") -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.READ)
    overview = await request.app[SERVICES_KEY].workloads.workload_overview(request.match_info["workload_id"], account=scope.owner)
    record = overview.workload
    waits = None
    if overview.explanation is not None:
        shown = _plain(workload_view(record, request.app[SERVICES_KEY].market.workload_terms(record)))
        waits = render_explanation(shown, _plain(explanation_view(overview.explanation)), datetime.now(UTC))
    ports = record.spec.ports
    data = storage_section(record.spec, await request.app[SERVICES_KEY].workloads.workload_storage(record))
    network = _network_section(record, request.app[SERVICES_KEY].workloads.network_paths(record))
    request[LIVE_STATE_KEY] = record.state
    usage = None
    if template == "renter/workload.html" and (record.assignments or record.started_at is not None):  # not the 2 s poll
        history = await request.app[SERVICES_KEY].telemetry.workload_telemetry(
            record.id,
            from_s=None,
            to_s=None,
            step_s=None,
            account=scope.owner,  # its runs over the last day
        )
        usage = utilization_chart(history)
    ended = [r.rental.id for r in overview.rentals if r.rental.ended_at is not None]
    return await page(
        request, template, fragment=template != "renter/workload.html", title=f"{record.spec.name} ({record.id})",
        w=record, overview=overview,
        waits=waits, ports=ports, money=format_amount, running=record.state == WorkloadState.RUNNING,
        open=record.state not in FINAL_WORKLOAD_STATES, now=time.time(),
        outputs=[_shown_output(kept) for kept in overview.outputs], output_lines=OUTPUT_LINES_SHOWN,
        links=request.app[SERVICES_KEY].links.links_of(record),
        storage=data, transfer=transfer_event, network=network,
        ssh_keys=await request.app[SERVICES_KEY].ssh_keys.list(owner=scope.principal.account), usage=usage,
        disputes=await rental_disputes(request, scope, ended),
    )  # fmt: skip


def utilization_chart(history: TelemetryHistory) -> TemplateContext:
    """The workload's GPU utilization over its last day, one line per GPU and run (x: unix seconds of each step's
    minute; y: the step's mean utilization, %), and the latest mean of each, as the chart's text says it."""
    series = []
    for s in history.series:
        name = f"{s.agent_id} {s.unit[:12] if s.unit else s.gpu_uuid[:12]}"
        series.append({
            "label": name, "x": [p.minute * 60 for p in s.points], "y": [round(p.utilization_avg, 1) for p in s.points],
        })  # fmt: skip
    said = [f"{one['label']}: {one['y'][-1]:g} %" for one in series if one["y"]]
    return {"series": series, "said": "; ".join(said) or "no samples yet"}


def _network_section(record: WorkloadRecord, paths: Mapping[int, Mapping[str, str]]) -> TemplateContext | None:
    """A gang's private network as the page shows it (docs/overlay.md): each replica's address, and how it reaches
    each peer as its host last said (None: the workload has no network)."""
    if not record.network:
        return None
    replicas = []
    for r in range(record.spec.replicas):
        peers = [{"address": address, "path": path} for address, path in sorted(paths.get(r, {}).items())]
        replicas.append({"replica": r, "address": replica_address(record.network, r), "peers": peers})
    return {"block": record.network, "replicas": replicas}


OUTPUT_LINES_SHOWN = 200  # of a deleted container's kept output, the page shows the last lines; the CLI has it all
OUTPUT_BYTES_SHOWN = 64 * 1024


def _shown_output(kept: KeptOutput) -> TemplateContext:
    """What the page shows of one kept output: its last lines as text (autoescaped by the template), and its facts."""
    text = last_lines(kept.data, OUTPUT_LINES_SHOWN)[-OUTPUT_BYTES_SHOWN:].decode("utf-8", "replace")
    return {
        "replica": kept.replica, "attempt": kept.attempt, "state": kept.state, "host": kept.agent_id,
        "exit_code": kept.exit_code, "reason": kept.reason, "truncated": kept.truncated, "text": text,
        "bytes": len(kept.data),
    }  # fmt: skip


async def workload_live(request: web.Request) -> web.Response:
    """The state and charge part of a workload's page, which the page polls (htmx) while the workload is open; when
    the state is not the one the page shows (``seen``) the whole page is reloaded (its logs and terminal appear)."""
    response = await workload(request, template="renter/workload_live.html")
    state = request.get(LIVE_STATE_KEY)
    if state is not None and state != request.query.get("seen"):
        response.headers["HX-Refresh"] = "true"
    return response


def _plain(view: msgspec.Struct) -> TemplateContext:
    """An answer struct as the plain JSON values the API would send (what the explanation's text is written from)."""
    plain: TemplateContext = msgspec.json.decode(msgspec.json.encode(view))
    return plain


async def stop(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    record = await request.app[SERVICES_KEY].workloads.cancel_workload(request.match_info["workload_id"], account=scope.owner)
    await session.flash(request, f"Stopping {record.id} ({record.spec.name}): {record.state}.")
    raise web.HTTPSeeOther(f"/console/workloads/{record.id}")


async def clone(request: web.Request) -> web.Response:
    """The launch form filled in from a workload's spec (what is never shown again left out, and said)."""
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    record = await request.app[SERVICES_KEY].workloads.get_workload(request.match_info["workload_id"], account=scope.owner)
    names = (await storage_choices(request, scope.principal.account)).secret_names
    form, notes = form_from_spec(record.spec, names)
    return await _launch_form(request, offer=None, form=form, errors=FormErrors(), clone_notes=notes)


async def restart(request: web.Request) -> web.Response:
    """Submit the same spec again, as a new workload; a refusal (money, a grid that cannot run it) is said on the
    workload's page."""
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    workload_id = request.match_info["workload_id"]
    try:
        record = await request.app[SERVICES_KEY].workloads.resubmit(workload_id, account=scope.owner)
    except (PaymentRequired, Conflict, InvalidWorkloadSpec) as exc:
        await session.flash(request, f"Not restarted: {exc}")
        raise web.HTTPSeeOther(f"/console/workloads/{workload_id}") from None
    await session.flash(request, f"Restarted {workload_id} as {record.id} ({record.spec.name}): {record.state}.")
    raise web.HTTPSeeOther(f"/console/workloads/{record.id}")


async def logs_socket(request: web.Request) -> web.StreamResponse:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.READ)
    return await serve_logs(request, scope, request.match_info["workload_id"])


async def terminal_socket(request: web.Request) -> web.StreamResponse:
    scope = await session.signed_in(request, Resource.WORKLOADS, Action.WRITE)
    return await serve_terminal(request, scope, request.match_info["workload_id"])


# --- billing -----------------------------------------------------------------------------------------------------


async def billing(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.LEDGER, Action.READ)
    after = integer(request.query, "after", FormErrors(), label="after", low=0, high=2**62, default=0) or 0
    billing = await request.app[SERVICES_KEY].billing.billing_overview(
        scope.principal.account, owner=scope.owner, after_seq=after, limit=LEDGER_PER_PAGE
    )
    funds, spend, statement = billing.funds, billing.spend, billing.statement
    chart = spend_chart(spend)
    services = request.app[SERVICES_KEY]
    settings = await settings_of(request, scope.principal.account)
    readings = services.spend_caps.readings(scope.principal.account)
    step = services.billing_settings.browser_step if settings is not None else None
    topups = await services.topups.list_topups(owner=scope.owner, account=scope.principal.account)
    waiting = _waiting_topup(topups, request.query.get("topup", ""), time.time())
    disputes = []  # the account's own as a renter: the billing page is the renter's (an operator's lists every one)
    if scope.principal.role is AccountRole.RENTER:
        disputes = await services.disputes.list_disputes(owner=scope.owner, role="renter", limit=DISPUTES_SHOWN)
    response = await page(
        request, "renter/billing.html", title="Billing", funds=funds, spend=spend, statement=statement, chart=chart,
        money=format_amount, after=after, settings=settings, readings=readings, step=step,
        topups=topups[:TOPUPS_SHOWN], waiting=waiting, disputes=disputes,
    )  # fmt: skip
    response.headers["Content-Security-Policy"] = billing_csp(step)
    return response


def _waiting_topup(topups: list[TopupRecord], topup_id: str, now: float) -> TopupRecord | None:
    """The top-up the renter just paid on this page (``?topup=``), while it waits for the provider's webhook, for at
    most ``TOPUP_WAIT_S``: the page reloads itself until it is credited or failed."""
    for topup in topups:
        if topup.id == topup_id and topup.state == "pending" and now - topup.created_at < TOPUP_WAIT_S:
            return topup
    return None


def spend_chart(spend: SpendOverTime) -> TemplateContext:
    """The chart's series: x in unix seconds (the middle of each hour, from the first charged hour), y in currency
    units, drawn as one bar per hour (``span``: the bucket), so nothing is drawn before the first charge or between
    hours."""
    middle = spend.bucket_s / 2
    return {"x": [p.start + middle for p in spend.points], "y": [p.spent / MICRO for p in spend.points], "span": spend.bucket_s}


async def ledger_csv(request: web.Request) -> web.Response:
    scope = await session.signed_in(request, Resource.LEDGER, Action.READ)
    market = request.app[SERVICES_KEY].market
    account = scope.principal.account
    statement = await market.ledger_statement(account, owner=scope.owner, after_seq=0, limit=100_000)
    return web.Response(
        text=market.statement_csv(statement),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="ledger-{account}.csv"'},
    )


NAV = [
    NavItem("renter", "Launch", "/console/launch", order=20),
    NavItem("renter", "My workloads", "/console/workloads", order=30),
    NavItem("renter", "Billing", "/console/billing", order=40),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/offers/{offer_id}/rent", rent_form)
    router.add_post("/console/offers/{offer_id}/rent", rent)
    router.add_get("/console/launch", launch_form)
    router.add_post("/console/launch", launch)
    router.add_get("/console/workloads", workloads)
    router.add_get("/console/workloads/{workload_id}", workload)
    router.add_get("/console/workloads/{workload_id}/live", workload_live)
    router.add_post("/console/workloads/{workload_id}/stop", stop)
    router.add_post("/console/workloads/{workload_id}/restart", restart)
    router.add_get("/console/workloads/{workload_id}/clone", clone)
    router.add_get("/console/workloads/{workload_id}/logs", logs_socket)
    router.add_get("/console/workloads/{workload_id}/terminal", terminal_socket)
    router.add_get("/console/billing", billing)
    router.add_get("/console/billing/ledger.csv", ledger_csv)
