"""Simulated GPUs' benchmark: the catalog's expected figures, a real answer to the challenge, and the cheats CI needs.

A simulated card computes the challenge's answer exactly (on the CPU, so only small shapes are practical) and then
takes as long as a card of its model would for the challenge's work, in the local grid's time scale
(``ChallengeTask.sim_rate_scale``, which the Master sends), so the Master's deadline judges it as it judges a real one.

Cheats (``SimulatedCheat``, from the agent's ``simulate_bench`` setting), each a way a dishonest host could try:
- ``as:MODEL``: the card reports the claimed model (its inventory) and that model's figures, but computes at the
  speed of MODEL (a T4 claiming to be an H100).
- ``replay``: answers every challenge with the first answer it computed (a recorded run).
- ``late``: computes honestly but commits after the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.benchmark.interface import BenchmarkRun, BenchmarkUnavailable, ChallengeTask
from agent.errors import SimulationSpecError
from common.catalog import GpuModel, UnknownGpuModel, expected_figures, resolve_alias
from common.challenge import FORM_ROUNDS, AnswerRows, answer_rows
from common.wire import BenchmarkFigures

LATE_BY_S = 1.0  # how far past the deadline the ``late`` cheat commits
SIMULATED_FP32_FRACTION = 1 / 12  # a simulated card's FP32 figure, as a share of its tensor figure (about Hopper's)


@dataclass(frozen=True)
class SimulatedCheat:
    """How a simulated host cheats; the default is honest."""

    performs_as: GpuModel | None = None
    replay: bool = False
    late: bool = False

    @classmethod
    def parse(cls, text: str) -> SimulatedCheat:
        """ "" (honest), "as:MODEL", "replay" or "late"; SimulationSpecError says what is wrong."""
        text = text.strip()
        if not text:
            return cls()
        if text == "replay":
            return cls(replay=True)
        if text == "late":
            return cls(late=True)
        if text.startswith("as:"):
            try:
                return cls(performs_as=resolve_alias(text[3:]))
            except UnknownGpuModel as exc:
                raise SimulationSpecError(f"simulate_bench {text!r}: {exc}") from None
        raise SimulationSpecError(f"simulate_bench must be '', 'as:MODEL', 'replay' or 'late', got {text!r}")


class SimulatedBenchmark:
    simulated = True
    forms: tuple[str, ...] = (FORM_ROUNDS,)

    def __init__(
        self,
        models: Mapping[str, GpuModel],
        cheat: SimulatedCheat | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``models``: each simulated GPU's uuid -> the model it reports."""
        self._models = dict(models)
        self.cheat = cheat or SimulatedCheat()
        self._clock = clock
        self._sleep = sleep
        self._recorded: AnswerRows | None = None  # the replay cheat's first answer

    def run(self, task: ChallengeTask) -> BenchmarkRun:
        claimed = self._models.get(task.gpu_uuid)
        if claimed is None:
            raise BenchmarkUnavailable(f"this host has no GPU {task.gpu_uuid}")
        started = self._clock()
        performs = self.cheat.performs_as or claimed
        if self.cheat.replay and self._recorded is not None:
            rows = self._recorded
        else:
            rows = answer_rows(task.seed, task.shape, task.form)
            if self.cheat.replay:
                self._recorded = rows
        figures = expected_figures(performs)
        tflops = figures.challenge_tflops if task.form == FORM_ROUNDS else figures.tensor_tflops
        rate = tflops * 1e12 * task.sim_rate_scale
        remaining = task.shape.flops / rate - (self._clock() - started)
        if self.cheat.late:
            remaining = max(remaining, task.deadline + LATE_BY_S - self._clock())
        if remaining > 0:
            self._sleep(remaining)
        return BenchmarkRun(figures=_figures(claimed, duration_s=self._clock() - started), rows=rows)


def _figures(model: GpuModel, *, duration_s: float) -> BenchmarkFigures:
    """What the card says it measured: its claimed model's expected figures (a cheat claims them too)."""
    expected = expected_figures(model)
    return BenchmarkFigures(
        fp32_tflops=round(expected.tensor_tflops * SIMULATED_FP32_FRACTION, 1),
        fp16_tflops=expected.tensor_tflops,
        bf16_tflops=expected.tensor_tflops if model.bf16_tflops else None,
        memory_bandwidth_gbs=expected.memory_bandwidth_gbs,
        h2d_gbs=expected.h2d_gbs,
        d2h_gbs=expected.h2d_gbs,
        allocatable_mib=int(model.memory_mib * 0.97),
        duration_s=round(duration_s, 3),
        simulated=True,
    )
