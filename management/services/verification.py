"""Measured verification as management shows and starts it: a GPU's latest verification and figures, a host's history
of runs, and the operator's request for a run now. The Master decides and records (master/verifier.py); this module
reads what it published (``Master.verifier``, its ``gpu.verification`` events) as records; their answers, for the API,
the CLI and the console alike, are management/views/verification.py's."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import NotFound
from master.port import HISTORY_KIND, VERIFIED, AgentRecord, EventRecord, GpuRecord, MasterPort

HISTORY_LIMIT = 1000  # runs read per GPU: daily runs for almost three years


@dataclass(frozen=True)
class GpuRuns:
    """A GPU and its ``gpu.verification`` events, newest first."""

    gpu: GpuRecord
    runs: list[EventRecord]


@dataclass(frozen=True)
class HostVerifications:
    """A host's GPUs, each with its runs (management/views/verification.py answers it)."""

    agent_id: str
    gpus: list[GpuRuns]


def performance_per_price(gpu: GpuRecord, price_micro_per_hour: int) -> float | None:
    """Measured dense tensor TFLOP/s per currency unit per GPU-hour, from a passed run's figures; None unmeasured."""
    v = gpu.verification
    if v is None or v.status != VERIFIED or v.figures is None or price_micro_per_hour <= 0:
        return None
    tflops = max(v.figures.bf16_tflops or 0.0, v.figures.fp16_tflops or 0.0)
    return round(tflops / (price_micro_per_hour / 1_000_000), 2) if tflops else None


class VerificationService:
    def __init__(self, master: MasterPort) -> None:
        self._master = master

    def _host(self, agent_id: str, owner: str | None) -> AgentRecord:
        agent = self._master.registry.agents.get(agent_id)
        if agent is None or (owner is not None and agent.provider != owner):
            raise NotFound(f"no agent {agent_id!r}")  # another provider's host answers as a missing one
        return agent

    async def request(self, agent_id: str, gpus: list[str]) -> list[str]:
        """The operator's ``POST /api/v1/agents/{id}/verify``: the challenges started now (NotFound, Conflict)."""
        self._host(agent_id, None)
        return await self._master.request_verification(agent_id, gpus)

    async def history(self, agent_id: str, *, owner: str | None = None) -> HostVerifications:
        """Each GPU of the host (its record carries its latest verification) and its runs, newest first."""
        self._host(agent_id, owner)
        gpus = []
        for gpu in self._master.gpus(agent_id):
            events = await self._master.events_after(subject=gpu.uuid, kind_prefix=HISTORY_KIND, limit=HISTORY_LIMIT)
            gpus.append(GpuRuns(gpu, [e for e in reversed(events) if e.kind == HISTORY_KIND]))
        return HostVerifications(agent_id, gpus)
