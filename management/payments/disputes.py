"""Disputes (docs/disputes.md): a renter disputes one of its ended rentals within the window, the disputed amount is
held off its provider's earnings, the provider may answer, and the operator resolves with a full, partial or no
refund. This module is the record and the rules, pure (no I/O, no clock): who may do what, the amounts, and the ledger
entries each step posts.

Ledger: ``dispute:<id>:hold`` moves the held amount from ``provider:<p>`` to ``dispute:<id>`` (so a payout, which pays
only from ``provider:<p>``, cannot pay it); ``dispute:<id>:resolve`` empties ``dispute:<id>``: the refund to
``renter:<r>``, the rest back to ``provider:<p>``, and, for a full refund, the platform's fee on the disputed host's
charges from ``platform:fees`` to the renter. Each key is posted once, so a step replayed moves nothing twice.

States: ``open`` (held) -> ``answered`` (the provider wrote its side; it may write again) -> ``resolved`` (final).
An operator may resolve an open dispute that was never answered.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from common.errors import Conflict, IdlegridError
from management.market.ledger import FEES, provider_account, renter_account
from management.market.money import BadAmount, format_amount, parse_amount
from master.port import EventData, LedgerEntry, LedgerLine, RentalRecord

DisputeState = Literal["open", "answered", "resolved"]
StateFilter = Literal["open", "answered", "resolved", "unresolved"]
# What each filter of a list (API ``?state=``, CLI ``--state``, the console's menu) keeps: "unresolved" is every
# dispute an operator still has to decide.
STATE_FILTERS: dict[str, tuple[DisputeState, ...]] = {
    "open": ("open",),
    "answered": ("answered",),
    "resolved": ("resolved",),
    "unresolved": ("open", "answered"),
}
Resolution = Literal["full", "partial", "none"]
RESOLUTIONS: tuple[str, ...] = ("full", "partial", "none")
HOLD_KIND = "dispute_hold"
RESOLVE_KIND = "dispute_resolve"
MAX_TEXT = 4000


class InvalidDispute(IdlegridError):
    """A dispute, answer or resolution asked with a value the rules refuse (the message names it): 400."""

    code = "invalid_dispute"


class ChargeEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger entry of the rental, as the renter's side saw it: ``amount`` its net on the renter's accounts."""

    key: str
    kind: str
    ts: float
    memo: str
    amount: int


class EventEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded fact about the host, its GPUs or the workload inside the rental's span."""

    ts: float
    kind: str
    subject: str
    data: EventData = {}


class TelemetryEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """The host's own readings in the rental's span, one-minute rollups summed up."""

    minutes: int = 0  # minutes with at least one sample of the host
    gpu_minutes: int = 0  # GPU-minutes with samples, over the rental's GPUs
    utilization_avg: float | None = None  # over the rental's GPUs' minutes
    temperature_max: float | None = None
    ecc_uncorrected_max: int = 0


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """What the grid knew of the rental when it was disputed, gathered automatically."""

    started_at: float
    ended_at: float | None
    seconds: int  # whole seconds metered (start to end)
    end_reason: str = ""
    host_failure: str = ""
    charges: list[ChargeEvidence] = []
    telemetry: TelemetryEvidence = TelemetryEvidence()
    faults: list[EventEvidence] = []  # gpu.fault, gpu.hardware_error, agent transitions (offline, ...)
    exits: list[EventEvidence] = []  # container.exited of the host in the span
    verification: list[EventEvidence] = []  # gpu.verification outcomes of the rental's GPUs
    truncated: bool = False  # the host's history was longer than what was read


class DisputeRecord(msgspec.Struct, kw_only=True):
    """One dispute of one rental's host (a rental is disputed once per host)."""

    id: str
    rental_id: str
    workload_id: str
    account: str  # the renter
    agent_id: str  # the disputed host
    provider: str  # its provider, whose earnings are held
    reason: str
    created_at: float
    disputable: int  # what the renter paid for the host in that rental, net of refunds (micro-units)
    held: int  # what was moved from provider:<p> to dispute:<id> (at most what the provider had)
    fee: int  # the platform's fee on the host's charges of the rental (returned on a full refund)
    state: DisputeState = "open"
    evidence: Evidence | None = None
    answer: str = ""
    answered_at: float | None = None
    resolution: Resolution | None = None
    refunded: int = 0  # to the renter, at resolution (the fee included on a full refund)
    released: int = 0  # back to the provider, at resolution
    note: str = ""  # the operator's, at resolution
    resolved_at: float | None = None
    resolved_by: str = ""
    version: int = 0


def new_dispute_id() -> str:
    return "dsp-" + secrets.token_hex(6)


def dispute_account(dispute_id: str) -> str:
    """The ledger account that holds a dispute's amount until it is resolved."""
    return f"dispute:{dispute_id}"


def hold_key(dispute_id: str) -> str:
    return f"dispute:{dispute_id}:hold"


def resolve_key(dispute_id: str) -> str:
    return f"dispute:{dispute_id}:resolve"


def clean_text(text: str, what: str, *, required: bool) -> str:
    """Free text as given (stripped), refused when empty (``required``) or too long."""
    text = text.strip()
    if required and not text:
        raise InvalidDispute(f"{what} must say why (it is empty)")
    if len(text) > MAX_TEXT:
        raise InvalidDispute(f"{what} is {len(text)} characters; at most {MAX_TEXT}")
    return text


def refund_amount(text: str | None) -> int | None:
    """A partial refund's micro-units as typed ("1.20"; None for none), or InvalidDispute saying what is wrong with it
    (negative, not a number, too precise): the API's body and the console's form read it alike."""
    if text is None:
        return None
    if text.strip().startswith("-"):
        raise InvalidDispute(f"amount must be more than 0, not {text}")
    try:
        return parse_amount(text)
    except BadAmount as exc:
        raise InvalidDispute(f"amount: {exc}") from None


def disputed_host(rental: RentalRecord, agent_id: str | None) -> str:
    """The host a dispute is about: the one named, or the rental's only host."""
    hosts = [h.agent_id for h in rental.hosts]
    if agent_id is None:
        if len(hosts) != 1:
            raise InvalidDispute(f"rental {rental.id} ran on {len(hosts)} hosts ({', '.join(hosts)}): name the host")
        return hosts[0]
    if agent_id not in hosts:
        raise InvalidDispute(f"rental {rental.id} did not run on host {agent_id!r} (its hosts: {', '.join(hosts)})")
    return agent_id


def check_window(rental: RentalRecord, now: float, window_s: float) -> None:
    """A rental is disputed once it has ended and within ``window_s`` of its end: Conflict otherwise."""
    if rental.ended_at is None:
        raise Conflict(f"rental {rental.id} is still running; dispute it once it has ended")
    if now > rental.ended_at + window_s:
        days = (now - rental.ended_at) / 86400
        raise Conflict(
            f"rental {rental.id} ended {days:.1f} days ago; a rental is disputed within {window_s / 86400:g} days of its end"
        )


def paid_for_host(entries: Iterable[LedgerEntry], account: str, agent_id: str) -> tuple[int, int]:
    """(what the provider ``account`` kept of the host's charges in the rental, net of refunds; the fee on them)."""
    kept = fee = 0
    for entry in entries:
        for line in entry.lines:
            if line.host != agent_id:
                continue
            if entry.kind in ("charge", "refund") and line.account == account:
                kept += line.amount
            elif entry.kind in ("charge", "refund") and line.account == FEES:
                fee += line.amount
    return max(0, kept), max(0, fee)


def hold_entry(rec: DisputeRecord, ts: float) -> LedgerEntry | None:
    """``provider:<p> -> dispute:<id>`` of the held amount (None when nothing is held)."""
    if rec.held <= 0:
        return None
    lines = [
        LedgerLine(account=provider_account(rec.provider), amount=-rec.held, host=rec.agent_id, workload=rec.workload_id),
        LedgerLine(account=dispute_account(rec.id), amount=rec.held, host=rec.agent_id, workload=rec.workload_id),
    ]
    memo = f"dispute {rec.id} of rental {rec.rental_id} on {rec.agent_id}: {format_amount(rec.held)} held from the payout"
    return LedgerEntry(key=hold_key(rec.id), ts=ts, kind=HOLD_KIND, memo=memo, lines=lines, rental=rec.rental_id)


def held_amount(disputable: int, balances: Mapping[str, int], provider: str) -> int:
    """What a new dispute holds: what the renter paid for the host, at most what the provider has."""
    return max(0, min(disputable, balances.get(provider_account(provider), 0)))


def refund_of(rec: DisputeRecord, resolution: str, amount: int | None) -> tuple[int, int]:
    """(refund to the renter from the hold, fee back from the platform) for a resolution; InvalidDispute for a
    resolution the rules refuse: an unknown one, a partial amount not above 0 or above what is held."""
    if resolution == "full":
        if amount is not None:
            raise InvalidDispute("a full refund takes no amount (it is everything held and the platform's fee)")
        return rec.held, rec.fee
    if resolution == "none":
        if amount is not None:
            raise InvalidDispute("a resolution with no refund takes no amount")
        return 0, 0
    if resolution == "partial":
        if amount is None:
            raise InvalidDispute("a partial refund names its amount")
        if amount <= 0 or amount > rec.held:
            raise InvalidDispute(
                f"a partial refund is more than 0 and at most what is held ({format_amount(rec.held)}), "
                f"not {format_amount(amount)}"
            )
        return amount, 0
    raise InvalidDispute(f"resolution must be one of {', '.join(RESOLUTIONS)}, not {resolution!r}")


def resolve_entry(
    rec: DisputeRecord, refund: int, fee_back: int, fees_balance: int, ts: float, by: str
) -> tuple[LedgerEntry | None, int]:
    """The entry releasing the hold (the refund to the renter, the rest to the provider, a full refund's fee back
    from the platform, at most what ``platform:fees`` has) and the fee it returns. None when it moves nothing."""
    fee_back = max(0, min(fee_back, fees_balance))
    rest = rec.held - refund
    renter, hold, wl = renter_account(rec.account), dispute_account(rec.id), rec.workload_id
    lines: list[LedgerLine] = []
    if rec.held:
        lines.append(LedgerLine(account=hold, amount=-rec.held, host=rec.agent_id, workload=wl))
    if rest:
        lines.append(LedgerLine(account=provider_account(rec.provider), amount=rest, host=rec.agent_id, workload=wl))
    if fee_back:
        lines.append(LedgerLine(account=FEES, amount=-fee_back, host=rec.agent_id, workload=wl))
    if refund + fee_back:
        lines.append(LedgerLine(account=renter, amount=refund + fee_back, workload=wl))
    if not lines:
        return None, 0
    memo = (
        f"dispute {rec.id} resolved by {by}: {format_amount(refund + fee_back)} refunded to {rec.account}, "
        f"{format_amount(rest)} released to {rec.provider}"
    )
    entry = LedgerEntry(key=resolve_key(rec.id), ts=ts, kind=RESOLVE_KIND, memo=memo, lines=lines, rental=rec.rental_id)
    return entry, fee_back
