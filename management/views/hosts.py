"""Hosts (agents) and their GPUs as the API shows them: facts, state, latest telemetry, MIG instances, what each runs
(never a renter's secrets), reputation and measured verification; and the tiers.

Records the answers pass through unchanged (a host's facts, a GPU's fault, a reputation) are described by their own
structs from ``master``/``common``; what an answer reshapes (times as RFC 3339 strings) has its own struct here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.inventory import GpuPartition, GpuReach, GpuSample, HostInfo, UnofferedGpu
from management.services.hosts import HostedReplica
from management.views.base import Time, View, page_of, rfc3339
from management.views.verification import GpuVerificationView, gpu_verification_view
from master.port import (
    AgentRecord,
    GpuFault,
    GpuRecord,
    Reputation,
    TierJson,
    reputation,
)


class SampleView(View):
    uuid: str
    ts: Time | None
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float | None
    power_w: float | None
    clock_sm_mhz: int | None
    ecc_corrected: int
    ecc_uncorrected: int
    clock_mem_mhz: int | None
    xid_count: int
    throttle_reasons: list[str]  # common.inventory.THROTTLE_REASONS


class PcieView(View):
    gen: int | None
    width: int | None


class MigInstanceView(View):
    uuid: str
    profile: str
    memory_mib: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    held_by: str | None


class MigView(View):
    enabled: bool
    instances: list[MigInstanceView]


class GpuView(View):
    uuid: str
    agent_id: str
    index: int
    name: str
    model: str
    tier: str | None
    state: str
    flags: list[str]
    fault: GpuFault | None
    offered: bool
    memory_total_mib: int
    compute_capability: str
    pcie: PcieView
    nvlinks: int
    simulated: bool
    updated_at: Time | None
    telemetry: SampleView | None
    held_by: str | None
    mig: MigView
    verification: GpuVerificationView
    # An AMD card's partition modes (compute SPX..CPX, memory NPS1..NPS4): reported, not sold. None: none reported.
    partition: GpuPartition | None = None


class HostedReplicaView(View):
    workload_id: str
    name: str
    image: str
    replica: int
    gpus: list[str]
    container: str
    state: str
    container_state: str
    started_at: Time | None


class AgentView(View):
    id: str
    provider: str
    state: str
    state_reason: str
    region: str
    relay: str
    reachable: bool
    runtime: str | None
    isolation: str | None
    images: list[str]
    simulated: bool
    host: HostInfo | None
    enrolled_at: Time | None
    last_seen: Time | None
    connected_since: Time | None
    cert_serial: str
    cert_not_after: Time | None
    drained: bool
    containers: list[str]
    exited: dict[str, int]
    # The agent's GPU self-test: whether each GPU reaches a container of its runtime, what was seen, the fix.
    gpu_selftest: list[GpuReach]
    # Cards the host has and does not offer (an iGPU, a card without its driver or library), each with why and the fix.
    unoffered_gpus: list[UnofferedGpu]
    gpus: list[GpuView]
    reputation: Reputation
    workloads: list[HostedReplicaView]


class TierView(View):
    name: str
    description: str
    criteria: TierJson  # the policy file's criteria as written
    examples: list[str]


AgentPage = page_of(AgentView)


GpuPage = page_of(GpuView)


TierPage = page_of(TierView)


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
        flags=list(gpu.flags),
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
        verification=gpu_verification_view(gpu),  # measured verification (management/views/verification.py)
        partition=gpu.info.partition,
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
        unoffered_gpus=list(agent.unoffered_gpus),
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
