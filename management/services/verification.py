"""Measured verification as management shows and starts it: a GPU's latest verification and figures, a host's history
of runs, and the operator's request for a run now. The Master decides and records (master/verifier.py); this module
reads what it published (``Master.verifier``, its ``gpu.verification`` events) and renders it for the API, the CLI and
the console alike."""

from __future__ import annotations

from typing import Any

import msgspec

from common.errors import NotFound
from master.port import HISTORY_KIND, VERIFIED, AgentRecord, EventRecord, GpuRecord, MasterPort, verification_label

HISTORY_LIMIT = 1000  # runs read per GPU: daily runs for almost three years


def instant(ts: float) -> str:
    # Imported when called: management.views imports this module (a GPU's answer carries its verification).
    from management.views import instant as rfc3339_instant

    return rfc3339_instant(ts)


def verification_view(gpu: GpuRecord) -> dict[str, Any]:
    """A GPU's latest verification: what the API's GPU answer carries as ``verification``."""
    v = gpu.verification
    return {
        "label": verification_label(gpu),  # "verified", "simulated", "unmeasured", "failed: late", ...
        "status": v.status if v is not None else None,
        "code": v.code if v is not None else "",
        "reason": v.reason if v is not None else "",
        "at": instant(v.at) if v is not None and v.at else None,
        "commit_s": v.commit_s if v is not None else None,
        "challenge_tflops": v.challenge_tflops if v is not None else None,
        "figures": msgspec.to_builtins(v.figures) if v is not None and v.figures is not None else None,
    }


def run_view(event: EventRecord) -> dict[str, Any]:
    """One run of a GPU's history, from its ``gpu.verification`` event."""
    data = event.data
    return {
        "challenge_id": str(data.get("challenge_id", "")),
        "status": str(data.get("status", "")),
        "code": str(data.get("code", "")),
        "reason": str(data.get("reason", "")),
        "at": instant(event.ts),
        "commit_s": data.get("commit_s"),
        "challenge_tflops": data.get("challenge_tflops"),
        "figures": data.get("figures"),
    }


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

    async def request(self, agent_id: str, gpus: list[str]) -> dict[str, Any]:
        """The operator's ``POST /api/v1/agents/{id}/verify``: challenges started now (NotFound, Conflict)."""
        self._host(agent_id, None)
        started = await self._master.request_verification(agent_id, gpus)
        return {"agent_id": agent_id, "challenges": started}

    async def history(self, agent_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Each GPU of the host with its latest verification and its runs, newest first."""
        self._host(agent_id, owner)
        gpus = []
        for gpu in self._master.gpus(agent_id):
            events = await self._master.events_after(subject=gpu.uuid, kind_prefix=HISTORY_KIND, limit=HISTORY_LIMIT)
            runs = [run_view(e) for e in reversed(events) if e.kind == HISTORY_KIND]
            gpus.append({"uuid": gpu.uuid, "model": gpu.model, "verification": verification_view(gpu), "runs": runs})
        return {"agent_id": agent_id, "gpus": gpus}
