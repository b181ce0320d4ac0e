"""Which benchmark an agent answers challenges with: the simulated one for simulated GPUs, else the real one when
this host can run it (the ``gpu`` extra and a driver), else none (the hello says so and the Master never asks)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.benchmark.interface import GpuBenchmark
from agent.benchmark.responder import HeldGpus, VerificationResponder
from agent.benchmark.simulated import SimulatedBenchmark, SimulatedCheat
from agent.executor import LABEL_GPUS, RUNNING
from agent.runtime import ContainerRuntime
from common.catalog import match_model
from common.inventory import GpuInfo

log = logging.getLogger(__name__)


def open_responder(
    gpus: Sequence[GpuInfo], *, simulated: bool, cheat: str, held_gpus: HeldGpus
) -> tuple[VerificationResponder, str]:
    """The responder and the benchmark's name for the hello ("simulated", "cuda" or "" when none can run)."""
    benchmark: GpuBenchmark | None
    if simulated:
        models = {gpu.uuid: model for gpu in gpus if (model := match_model(gpu)) is not None}
        benchmark, kind, why = SimulatedBenchmark(models, SimulatedCheat.parse(cheat)), "simulated", ""
    elif not gpus:
        benchmark, kind, why = None, "", "this host has no GPU"
    else:
        from agent.benchmark.cuda import open_benchmark  # the real path; importing it needs no GPU

        benchmark, why = open_benchmark()
        kind = "cuda" if benchmark is not None else ""
        if benchmark is None:
            log.warning("no GPU benchmark: this host's GPUs will show unmeasured", extra={"why": why})
    return VerificationResponder(benchmark, why, held_gpus), kind


def held_by_containers(runtime: ContainerRuntime) -> HeldGpus:
    """The GPUs a running container of ``runtime`` holds, by the label the executor puts on it."""

    async def held() -> set[str]:
        return {
            gpu
            for container in await runtime.list()
            if container.state == RUNNING
            for gpu in filter(None, container.labels.get(LABEL_GPUS, "").split(","))
        }

    return held
