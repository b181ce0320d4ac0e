"""Measured verification's answers (docs/verification.md): a GPU's latest verification, which every GPU answer
carries, a host's history of runs, and the operator's request for a run now. What the Master recorded
(master/verifier.py) is read by management/services/verification.py; its records become these answers here."""

from __future__ import annotations

import msgspec

from common.wire import BenchmarkFigures
from management.services.verification import HostVerifications
from management.views.base import Time, View, instant
from master.port import EventRecord, GpuRecord, verification_label


class GpuVerificationView(View):
    """A GPU's latest measured verification (management/services/verification.py); ``label`` is what a person reads."""

    label: str  # "verified", "simulated", "unmeasured", "failed: late", ...
    status: str | None  # "verified" | "failed" | "refused"; None: never run
    code: str
    reason: str
    at: Time | None
    commit_s: float | None
    challenge_tflops: float | None
    figures: BenchmarkFigures | None


class VerifyStarted(View):
    agent_id: str
    challenges: list[str]  # the challenges sent now; a GPU already being verified is not asked twice


class VerificationRunView(View):
    challenge_id: str
    status: str  # "verified" | "failed" | "refused"
    code: str
    reason: str
    at: Time
    commit_s: float | None
    challenge_tflops: float | None
    figures: BenchmarkFigures | None


class GpuVerificationsView(View):
    uuid: str
    model: str
    verification: GpuVerificationView
    runs: list[VerificationRunView]  # newest first


class HostVerificationsView(View):
    agent_id: str
    gpus: list[GpuVerificationsView]


def gpu_verification_view(gpu: GpuRecord) -> GpuVerificationView:
    """A GPU's latest verification: what the API's GPU answer carries as ``verification``."""
    v = gpu.verification
    if v is None:
        return GpuVerificationView(
            label=verification_label(gpu),
            status=None,
            code="",
            reason="",
            at=None,
            commit_s=None,
            challenge_tflops=None,
            figures=None,
        )
    return GpuVerificationView(
        label=verification_label(gpu),
        status=v.status,
        code=v.code,
        reason=v.reason,
        at=instant(v.at) if v.at else None,
        commit_s=v.commit_s,
        challenge_tflops=v.challenge_tflops,
        figures=v.figures,
    )


def verification_run_view(event: EventRecord) -> VerificationRunView:
    """One run of a GPU's history, from its ``gpu.verification`` event (its data as the verifier recorded it)."""
    data = event.data
    figures = data.get("figures")
    return VerificationRunView(
        challenge_id=str(data.get("challenge_id", "")),
        status=str(data.get("status", "")),
        code=str(data.get("code", "")),
        reason=str(data.get("reason", "")),
        at=instant(event.ts),
        commit_s=data.get("commit_s"),
        challenge_tflops=data.get("challenge_tflops"),
        figures=msgspec.convert(figures, BenchmarkFigures) if figures is not None else None,
    )


def host_verifications_view(history: HostVerifications) -> HostVerificationsView:
    """Each GPU of the host with its latest verification and its runs, newest first."""
    return HostVerificationsView(
        agent_id=history.agent_id,
        gpus=[
            GpuVerificationsView(
                uuid=g.gpu.uuid,
                model=g.gpu.model,
                verification=gpu_verification_view(g.gpu),
                runs=[verification_run_view(e) for e in g.runs],
            )
            for g in history.gpus
        ],
    )
