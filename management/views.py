"""What the API shows of the Master's records, one function per answer, each building its answer struct
(management/http/responses.py): the struct is the one definition of an answer's shape, which the OpenAPI document
states and the console reads too. (The market's offers, management/market/offers.py, are still dicts, held to their
structs by tests/management/test_api_responses.py.)

Every timestamp is an RFC 3339 UTC string with milliseconds ("2026-11-22T17:40:00.000Z"), or null
for a moment that has not happened (the records keep 0 or None for "never").
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import msgspec

from common.inventory import GpuSample, HostSample
from common.overlay import replica_address
from management.client.tunnel import TunnelGrant
from management.http.responses import (
    AccountView,
    AgentView,
    ApiKeyView,
    BidChangeView,
    CommandAccepted,
    CommandView,
    Credited,
    EarningsStatements,
    EventView,
    ExplanationView,
    FundsView,
    GpuVerificationView,
    GpuView,
    HostEarningsView,
    HostedReplicaView,
    HostPointView,
    HostPriceView,
    HostSampleView,
    IssuedApiKeyView,
    LedgerEntryView,
    LedgerLineView,
    MigInstanceView,
    MigView,
    NetworkView,
    OutputView,
    PayoutStatements,
    PcieView,
    PeriodEarningsView,
    PriceListing,
    PriceRecordView,
    PriceTermsView,
    RentalHostView,
    RentalTermsView,
    RentalView,
    ReplicaNetworkView,
    SampleView,
    SigningKeyView,
    SpendStatements,
    StatementLineView,
    StatementView,
    StorageView,
    TelemetryPointView,
    TelemetrySeriesView,
    TelemetrySubject,
    TelemetryView,
    TokenView,
    TransferView,
    TunnelGrantView,
    WhoamiView,
    WorkloadDetail,
    WorkloadSpecView,
    WorkloadSpendView,
    WorkloadView,
)
from management.market.ledger import Statement
from management.market.money import format_amount
from management.market.prices import HostPrice
from management.monitoring.history import TelemetryHistory
from management.scheduler.model import Explanation
from management.services.hosts import HostedReplica
from management.services.market import FundsDetail, RentalDetail, Statements
from management.services.verification import verification_view
from management.workloads.storage import StorageSummary
from master.port import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuRecord,
    HostRollup,
    KeptOutput,
    LedgerEntry,
    PriceRecord,
    SigningKeyInfo,
    TelemetryRollup,
    TokenRecord,
    WorkloadRecord,
    reputation,
)


def rfc3339(ts: float | None) -> str | None:
    """Unix seconds as RFC 3339 UTC with milliseconds; None (null) for None or 0 (never)."""
    return instant(ts) if ts else None


def instant(ts: float) -> str:
    """Unix seconds as RFC 3339 UTC with milliseconds, the epoch included: for a window's bounds, where 0 is a time
    someone asked for, not "never" (rfc3339's None)."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def sample_view(sample: GpuSample) -> SampleView:
    return SampleView(
        uuid=sample.uuid,
        ts=rfc3339(sample.ts),
        utilization_pct=sample.utilization_pct,
        memory_used_mib=sample.memory_used_mib,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
        clock_sm_mhz=sample.clock_sm_mhz,
        ecc_corrected=sample.ecc_corrected,
        ecc_uncorrected=sample.ecc_uncorrected,
        clock_mem_mhz=sample.clock_mem_mhz,
        xid_count=sample.xid_count,
        throttle_reasons=list(sample.throttle_reasons),
    )


def gpu_view(
    gpu: GpuRecord, latest: GpuSample | None = None, *, offered: bool = False, holders: Mapping[str, str] | None = None
) -> GpuView:
    """``offered``: renters are offered this GPU now (available, on a host that isolates workloads well enough).
    ``holders``: the container holding the GPU, or each of its MIG instances (uuid -> container name)."""
    holders = holders or {}
    return GpuView(
        uuid=gpu.uuid,
        agent_id=gpu.agent_id,
        index=gpu.index,
        name=gpu.info.name,
        model=gpu.model,
        tier=gpu.tier,
        state=gpu.state,
        flags=gpu.flags,
        # Why the GPU is faulty (an Xid, ECC errors, overheating), until repaired or cooled down; None when healthy.
        fault=gpu.fault,
        offered=offered,
        memory_total_mib=gpu.info.memory_total_mib,
        compute_capability=gpu.info.compute_capability,
        pcie=PcieView(gen=gpu.info.pcie_gen, width=gpu.info.pcie_width),
        nvlinks=sum(1 for link in gpu.info.nvlinks if link.active),
        simulated=gpu.info.simulated,
        updated_at=rfc3339(gpu.updated_at),
        telemetry=sample_view(latest) if latest is not None else None,
        held_by=holders.get(gpu.uuid),  # the container holding the whole GPU, None when none does
        mig=mig_view(gpu, holders),
        verification=GpuVerificationView(**verification_view(gpu)),  # measured verification (management/services/verification.py)
    )


def mig_view(gpu: GpuRecord, holders: Mapping[str, str]) -> MigView:
    """A GPU's MIG mode and instances, each with the container holding it (None: free)."""
    return MigView(
        enabled=gpu.info.mig_enabled,
        instances=[
            MigInstanceView(
                uuid=m.uuid,
                profile=m.profile,
                memory_mib=m.memory_mib,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                held_by=holders.get(m.uuid),
            )
            for m in gpu.info.mig_instances
        ],
    )


def agent_view(
    agent: AgentRecord,
    gpus: list[GpuRecord],
    latest: Mapping[str, GpuSample] | None = None,
    *,
    reachable: bool = False,
    offered: frozenset[str] = frozenset(),
    workloads: Sequence[HostedReplica] = (),
    holders: Mapping[str, str] | None = None,
) -> AgentView:
    """``reachable``: a relay link carries the agent now (a command reaches it at once, not on its return).
    ``offered``: uuids of its GPUs renters are offered now. ``workloads``: what runs (or is being started or stopped)
    on it, as its provider may see it (``hosted_replica_view``)."""
    latest = latest or {}
    return AgentView(
        id=agent.id,
        provider=agent.provider,
        state=agent.state,
        state_reason=agent.state_reason,
        region=agent.region,
        relay=agent.relay,
        reachable=reachable,
        runtime=agent.runtime or None,  # what runs containers on the host: docker | process | simulated
        isolation=agent.isolation or None,  # how workloads are kept from the host: container | sandbox | none
        images=list(agent.images),  # the images it already has, warm first: a renter's container starts at once
        simulated=agent.simulated,
        host=agent.host if agent.host else None,
        enrolled_at=rfc3339(agent.enrolled_at),
        last_seen=rfc3339(agent.last_seen),
        connected_since=rfc3339(agent.connected_since),
        cert_serial=agent.cert_serial,
        cert_not_after=rfc3339(agent.cert_not_after),
        drained=agent.drained,
        containers=sorted(agent.containers),
        exited=dict(agent.exited),  # containers that ended on their own (name -> exit status), until deleted
        gpu_selftest=list(agent.gpu_reach),  # a GPU listed unreachable is not offered
        gpus=[gpu_view(g, latest.get(g.uuid), offered=g.uuid in offered, holders=holders) for g in gpus],
        reputation=reputation(agent),
        workloads=[hosted_replica_view(r) for r in workloads],
    )


def hosted_replica_view(replica: HostedReplica) -> HostedReplicaView:
    """One replica placed on a host, for the host's provider and the operator: what runs there and on which GPUs.
    Never the renter's env (names or values), command, labels or account: a provider learns what its hardware
    runs, not the renter's secrets or who the renter is."""
    return HostedReplicaView(
        workload_id=replica.workload_id,
        name=replica.name,
        image=replica.image,
        replica=replica.replica,
        gpus=replica.units,
        container=replica.container,
        state=replica.state,
        container_state=replica.container_state,
        started_at=rfc3339(replica.started_at),
    )


def redact_registry_auth(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A spec with its registry credentials reduced to the username: the password is the renter's secret, sent to the
    hosts only and never shown again, to anyone (the operator's command list included). ``spec`` is JSON (a command's
    stored body, a workload spec as builtins) and so is what it returns: a view."""
    auth = spec.get("registry_auth")
    if not isinstance(auth, Mapping):
        return dict(spec)
    return {**spec, "registry_auth": {"username": auth.get("username", "")}}


def redact_container_secrets(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A create command's spec as answers show it: the registry password gone (``redact_registry_auth``), the env's
    values hidden (they may be the renter's secrets, resolved from ``${secret:NAME}``), the storage keys reduced to
    the key id (docs/storage.md)."""
    shown = redact_registry_auth(spec)
    env = shown.get("env")
    if isinstance(env, Mapping):
        shown["env"] = {name: "<hidden>" for name in env}
    storage = shown.get("storage")
    if isinstance(storage, Mapping) and isinstance(storage.get("credentials"), Mapping):
        shown["storage"] = {**storage, "credentials": {"access_key_id": storage["credentials"].get("access_key_id", "")}}
    return shown


def command_view(command: CommandRecord) -> CommandView:
    return CommandView(
        id=command.id,
        agent_id=command.agent_id,
        kind=command.kind,
        spec=redact_container_secrets(command.spec),
        state=command.state,
        created_at=rfc3339(command.created_at),
        deadline=rfc3339(command.deadline),
        sent_at=rfc3339(command.sent_at),
        acked_at=rfc3339(command.acked_at),
        finished_at=rfc3339(command.finished_at),
        attempts=command.attempts,
        key_id=command.key_id,  # the command-signing key its signature is made with
        result=command.result,
        error=command.error,
    )


def event_view(event: EventRecord) -> EventView:
    """``data`` is the event's payload as recorded (its own fields, numbers included, are not reinterpreted)."""
    return EventView(seq=event.seq, ts=rfc3339(event.ts), kind=event.kind, subject=event.subject, data=event.data)


def token_view(token: str, record: TokenRecord) -> TokenView:
    """The token itself is shown this once; only its hash is kept."""
    return TokenView(token=token, provider=record.provider, expires_at=rfc3339(record.expires_at))


def command_accepted_view(command: CommandRecord) -> CommandAccepted:
    return CommandAccepted(id=command.id, state=command.state)


def signing_key_view(key: SigningKeyInfo) -> SigningKeyView:
    return SigningKeyView(
        key_id=key.key_id,
        public_key=key.public_key,
        state=key.state.value,
        created_at=rfc3339(key.created_at),
        retired_at=rfc3339(key.retired_at),
    )


def output_view(kept: KeptOutput) -> OutputView:
    """What is kept of a deleted container's output, without the bytes."""
    return OutputView(
        replica=kept.replica,
        attempt=kept.attempt,
        state=kept.state,
        host=kept.agent_id,
        bytes=len(kept.data),
        truncated=kept.truncated,
        exit_code=kept.exit_code,
        reason=kept.reason,
        ended_at=rfc3339(kept.ended_at),
        collected_at=rfc3339(kept.collected_at),
    )


def workload_spec_view(workload: WorkloadRecord) -> WorkloadSpecView:
    """The spec as submitted, but the env's values are the renter's secrets: they go to the containers only, and are
    never shown again, to anyone (the names are, so a renter can check what it sent); so is the registry password."""
    spec = msgspec.to_builtins(workload.spec)
    spec["env"] = sorted(workload.spec.env)
    return msgspec.convert(redact_registry_auth(spec), WorkloadSpecView)


def workload_view(workload: WorkloadRecord, terms: Mapping[str, Any]) -> WorkloadView:
    """A workload as its owner and the operator see it. ``terms``: how it pays (the market's ``workload_terms``),
    stated in every answer about a workload as ``rental``."""
    return WorkloadView(**_workload_fields(workload, terms))


def workload_detail(
    workload: WorkloadRecord,
    terms: Mapping[str, Any],
    waiting: Explanation | None,
    outputs: Sequence[KeptOutput],
    paths: Mapping[int, dict[str, str]] | None = None,
    storage: StorageSummary | None = None,
) -> WorkloadDetail:
    """One workload: its view, why it waits while it is queued (None otherwise), the output kept of its deleted
    containers, a gang's network with each replica's address and how it reaches its peers (``paths``: replica ->
    peer -> "direct" or "relay", from WorkloadsService.network_paths), and what moved of its data (``storage``)."""
    return WorkloadDetail(
        **_workload_fields(workload, terms),
        waiting=explanation_view(waiting) if waiting is not None else None,
        outputs=[output_view(kept) for kept in outputs],
        network=network_view(workload, paths or {}) if workload.network else None,
        storage=storage_view(storage) if storage is not None else None,
    )


def storage_view(s: StorageSummary) -> StorageView:
    return StorageView(
        checkpoint_at=rfc3339(s.checkpoint_at),
        checkpoint_bytes=s.checkpoint_bytes,
        checkpoint_uploads=s.checkpoint_uploads,
        restored_from=rfc3339(s.restored_at),
        transfer_s=round(s.transfer_s, 3),
        last_error=s.last_error,
        recent=[
            TransferView(at=rfc3339(t.at), what=t.what, host=t.host, bytes=t.bytes, seconds=round(t.seconds, 3), error=t.error)
            for t in s.recent
        ],
    )


def network_view(workload: WorkloadRecord, paths: Mapping[int, dict[str, str]]) -> NetworkView:
    replicas = [
        ReplicaNetworkView(replica=r, address=replica_address(workload.network, r), peers=dict(paths.get(r, {})))
        for r in range(workload.spec.replicas)
    ]
    return NetworkView(network=workload.network, replicas=replicas)


def _workload_fields(workload: WorkloadRecord, terms: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": workload.id,
        "account": workload.account,
        "name": workload.spec.name,
        "state": workload.state,
        "state_reason": workload.state_reason,
        "spec": workload_spec_view(workload),
        "created_at": rfc3339(workload.created_at),
        "queued_at": rfc3339(workload.queued_at),
        "scheduled_at": rfc3339(workload.scheduled_at),
        "started_at": rfc3339(workload.started_at),
        "finished_at": rfc3339(workload.finished_at),
        "attempts": workload.attempts,
        "restarts": workload.restarts,
        "preemptions": workload.preemptions,
        "exit_codes": workload.exit_codes,
        "assignments": list(workload.assignments),
        "host_failure": workload.host_failure or None,
        "detail": workload.detail,  # while it starts: how its image pull goes
        "version": workload.version,
        "rental": RentalTermsView(**terms),
    }


def explanation_view(explanation: Explanation) -> ExplanationView:
    """Why a workload waits: the scheduler core's explanation as it is (its sentences already speak of workloads and
    print times for people), with its two times as RFC 3339."""
    fields = {field.name: getattr(explanation, field.name) for field in dataclasses.fields(explanation)}
    fields["reserved_start"] = rfc3339(explanation.reserved_start)
    fields["estimated_start"] = rfc3339(explanation.estimated_start)
    return ExplanationView(**fields)


# --- accounts and API keys ------------------------------------------------------------------------


def account_view(account: AccountRecord) -> AccountView:
    return AccountView(
        id=account.id,
        role=account.role,
        name=account.name,
        disabled=account.disabled,
        created_at=rfc3339(account.created_at),
        updated_at=rfc3339(account.updated_at or None),
        share=account.share,
        project_shares=account.project_shares,
        gpu_quota=account.gpu_quota,
        tier_quotas=account.tier_quotas,
    )


def _key_fields(key: ApiKeyRecord) -> dict[str, Any]:
    """Never the key, never its hash."""
    return {
        "key_id": key.key_id,
        "account": key.subject,
        "name": key.name,
        "created_at": rfc3339(key.created_at),
        "last_used": rfc3339(key.last_used),
        "revoked_at": rfc3339(key.revoked_at),
    }


def api_key_view(key: ApiKeyRecord) -> ApiKeyView:
    return ApiKeyView(**_key_fields(key))


def issued_api_key_view(key: str, record: ApiKeyRecord) -> IssuedApiKeyView:
    """The key itself is shown this once; only its hash is kept."""
    return IssuedApiKeyView(key=key, **_key_fields(record))


def whoami_view(account: str, role: str, key_id: str, key_name: str, name: str) -> WhoamiView:
    return WhoamiView(account=account, role=role, key_id=key_id, key_name=key_name, name=name)


# --- the market: prices (management/api/resources/prices.py) -------------------------------------------------------------------
# Money goes out as decimal strings per GPU-hour ("2.50"), with the currency; never a float.


def _price_terms(price: HostPrice) -> dict[str, Any]:
    return {
        "on_demand": format_amount(price.on_demand),
        "min_bid": format_amount(price.min_bid) if price.min_bid is not None else None,  # null: not interruptible
        "reserved_discount": price.reserved_discount,
        "reserved": format_amount(price.reserved),
        "max_duration_s": price.max_duration_s,
    }


def price_record_view(record: PriceRecord, currency: str) -> PriceRecordView:
    """One provider's price record: its default (``agent_id`` null) or one host's own."""
    terms = HostPrice(
        on_demand=record.on_demand,
        min_bid=record.min_bid,
        reserved_discount=record.reserved_discount,
        max_duration_s=record.max_duration_s,
    )
    return PriceRecordView(
        provider=record.provider,
        agent_id=record.agent_id or None,
        scope="host" if record.agent_id else "provider",
        currency=currency,
        updated_at=rfc3339(record.updated_at),
        **_price_terms(terms),
    )


def host_price_view(agent_id: str, provider: str, price: HostPrice, currency: str) -> HostPriceView:
    """The price in force on a host and its ``source``: the host's own, its provider's default, or the grid's."""
    return HostPriceView(agent_id=agent_id, provider=provider, source=price.source, currency=currency, **_price_terms(price))


def price_listing_view(records: Sequence[PriceRecord], grid_default: HostPrice, currency: str) -> PriceListing:
    return PriceListing(
        currency=currency,
        grid_default=PriceTermsView(**_price_terms(grid_default)),
        items=[price_record_view(r, currency) for r in records],
    )


# --- the market -------------------------------------------------------------------------------------------------
# Money as decimal strings in the grid's currency ("2.50"), exact to the micro-unit.


def funds_view(funds: FundsDetail) -> FundsView:
    covers = funds.covers_s
    return FundsView(
        account=funds.account,
        currency=funds.currency,
        available=format_amount(funds.available),
        held=format_amount(funds.held),
        running_per_hour=format_amount(funds.running_per_hour),
        covers_s=round(covers, 1) if covers is not None else None,
        warning=funds.warning or None,
    )


def ledger_entry_view(entry: LedgerEntry) -> LedgerEntryView:
    return LedgerEntryView(
        seq=entry.seq,
        key=entry.key,
        ts=rfc3339(entry.ts),
        kind=entry.kind,
        memo=entry.memo,
        rental=entry.rental or None,
        lines=[
            LedgerLineView(
                account=line.account,
                amount=format_amount(line.amount),
                host=line.host or None,
                workload=line.workload or None,
            )
            for line in entry.lines
        ],
    )


def credited_view(entry: LedgerEntry, funds: FundsDetail) -> Credited:
    """A credit: the entry written and the balance after it."""
    return Credited(entry=ledger_entry_view(entry), balance=funds_view(funds))


def statement_view(statement: Statement, currency: str) -> StatementView:
    """A ledger statement: each entry's effect on the account's ledger accounts, with the balance after it."""
    return StatementView(
        accounts=statement.accounts,
        currency=currency,
        after_seq=statement.after_seq,
        opening=format_amount(statement.opening),
        closing=format_amount(statement.closing),
        lines=[
            StatementLineView(
                seq=line.seq,
                ts=rfc3339(line.ts),
                key=line.key,
                kind=line.kind,
                memo=line.memo,
                rental=line.rental or None,
                workload=line.workload or None,
                amount=format_amount(line.amount),
                balance=format_amount(line.balance),
            )
            for line in statement.lines
        ],
        next_after=statement.next_after,
        more=statement.more,
    )


def spend_view(statements: Statements) -> SpendStatements:
    """A renter's spend per workload (``Statements`` of WorkloadSpend), every amount as a decimal string."""
    items = [
        WorkloadSpendView(
            workload=item.workload,
            charged=format_amount(item.charged),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return SpendStatements(account=statements.account, currency=statements.currency, items=items)


def earnings_view(statements: Statements) -> EarningsStatements:
    """A provider's earnings per host (``Statements`` of HostEarnings)."""
    items = [
        HostEarningsView(
            agent_id=item.agent_id,
            gross=format_amount(item.gross),
            fee=format_amount(item.fee),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return EarningsStatements(account=statements.account, currency=statements.currency, items=items)


def payouts_view(statements: Statements) -> PayoutStatements:
    """A provider's earnings per period (``Statements`` of PeriodEarnings), the period's bounds as RFC 3339."""
    items = [
        PeriodEarningsView(
            label=item.label,
            start=rfc3339(item.start),
            end=rfc3339(item.end),
            gross=format_amount(item.gross),
            fee=format_amount(item.fee),
            refunded=format_amount(item.refunded),
            net=format_amount(item.net),
        )
        for item in statements.items
    ]
    return PayoutStatements(account=statements.account, currency=statements.currency, items=items)


def rental_view(detail: RentalDetail, *, for_provider: bool) -> RentalView:
    """A rental; a provider sees its hosts' rentals without the renter or its workload (they are the renter's)."""
    r = detail.rental
    view = RentalView(
        id=r.id,
        kind=r.kind,
        currency=detail.currency,
        hosts=[
            RentalHostView(agent_id=h.agent_id, provider=h.provider, gpus=h.gpus, price=format_amount(h.price)) for h in r.hosts
        ],
        bid_changes=[BidChangeView(at=rfc3339(c.at), price=format_amount(c.price)) for c in r.bid_changes],
        gpus=r.gpus,
        started_at=rfc3339(r.started_at),
        ended_at=rfc3339(r.ended_at),
        end_reason=r.end_reason or None,
        host_failure=r.host_failure or None,
        reserved_until=rfc3339(r.reserved_until),
        rating=r.rating,
        charged=format_amount(detail.charged),
    )
    if not for_provider:
        view.account = r.account
        view.workload = r.workload_id
    return view


def tunnel_grant_view(grant: TunnelGrant) -> TunnelGrantView:
    fields = msgspec.structs.asdict(grant)
    fields["expires_at"] = instant(grant.expires_at)
    return TunnelGrantView(**fields)


# --- telemetry history (management/monitoring/history.py) --------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _day_text(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, UTC).strftime("%Y-%m-%d")


def minute_time(minute: int) -> str:
    """A whole minute (unix time // 60) as ``rfc3339`` writes it, without a datetime per call: a week at one-minute
    steps is 10,080 of them in one answer."""
    day, rest = divmod(minute, 1440)
    hour, minute_of_hour = divmod(rest, 60)
    return f"{_day_text(day)}T{hour:02d}:{minute_of_hour:02d}:00.000Z"


def telemetry_point_view(point: TelemetryRollup) -> TelemetryPointView:
    return TelemetryPointView(
        ts=minute_time(point.minute),
        minutes=point.minutes,
        samples=point.samples,
        utilization_avg=point.utilization_avg,
        utilization_max=point.utilization_max,
        memory_used_mib_avg=point.memory_used_mib_avg,
        memory_used_mib_max=point.memory_used_mib_max,
        temperature_avg=point.temperature_avg,
        temperature_max=point.temperature_max,
        power_avg_w=point.power_avg_w,
        power_max_w=point.power_max_w,
        clock_sm_avg_mhz=point.clock_sm_avg_mhz,
        clock_mem_avg_mhz=point.clock_mem_avg_mhz,
        ecc_corrected=point.ecc_corrected,
        ecc_uncorrected=point.ecc_uncorrected,
        xid_count=point.xid_count,
        throttle_reasons=list(point.throttle_reasons),
    )


def host_sample_view(sample: HostSample) -> HostSampleView:
    fields = msgspec.structs.asdict(sample)
    fields["ts"] = rfc3339(sample.ts)
    return HostSampleView(**fields)


def _per_second(moved: int | None, minutes: int) -> float | None:
    return None if moved is None else round(moved / (minutes * 60), 2)


def host_point_view(point: HostRollup) -> HostPointView:
    """One step of a host's own history; network as bytes per second over the minutes it has data for."""
    return HostPointView(
        ts=minute_time(point.minute),
        minutes=point.minutes,
        samples=point.samples,
        cpu_pct_avg=point.cpu_pct_avg,
        cpu_pct_max=point.cpu_pct_max,
        load_1m_avg=point.load_1m_avg,
        ram_used_mib_avg=point.ram_used_mib_avg,
        ram_used_mib_max=point.ram_used_mib_max,
        ram_total_mib=point.ram_total_mib,
        disk_used_gib=point.disk_used_gib,
        disk_free_gib_min=point.disk_free_gib_min,
        net_rx_bytes_per_s=_per_second(point.net_rx_bytes, point.minutes),
        net_tx_bytes_per_s=_per_second(point.net_tx_bytes, point.minutes),
    )


def telemetry_view(history: TelemetryHistory) -> TelemetryView:
    window = history.window
    return TelemetryView(
        subject=cast(TelemetrySubject, history.subject),  # the history's subject is one of the three
        id=history.subject_id,
        from_=instant(window.since_minute * 60.0),
        to=instant(window.until_minute * 60.0),
        step_s=window.step_minutes * 60,
        resolution_s=history.resolution_minutes * 60,
        host=host_sample_view(history.host_latest) if history.host_latest is not None else None,
        host_points=None if history.host_points is None else [host_point_view(p) for p in history.host_points],
        series=[
            TelemetrySeriesView(
                gpu_uuid=s.gpu_uuid,
                agent_id=s.agent_id,
                unit=s.unit or None,
                since=rfc3339(s.since),
                until=rfc3339(s.until),
                points=[telemetry_point_view(p) for p in s.points],
            )
            for s in history.series
        ],
    )
