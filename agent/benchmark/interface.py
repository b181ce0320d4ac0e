"""What a GPU benchmark is, for the real card (agent/benchmark/cuda.py) and the simulated one alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from common.challenge import FORM_SUM, AnswerRows, Shape
from common.errors import IdlegridError
from common.wire import BenchmarkFigures


class BenchmarkUnavailable(IdlegridError):
    """The benchmark cannot run on this host (no driver, no ``gpu`` extra installed); the message says what to do."""

    code = "benchmark_unavailable"


@dataclass(frozen=True)
class ChallengeTask:
    """One challenge as the benchmark sees it: the seed and shape of the product it must compute."""

    challenge_id: str
    gpu_uuid: str
    seed: int
    shape: Shape
    deadline: float  # the Master's clock
    sim_rate_scale: float = 1.0  # simulated GPUs only: the local grid's time scale
    form: str = FORM_SUM  # common/challenge.py FORMS: what the answer's rows are


@dataclass(frozen=True)
class BenchmarkRun:
    """The benchmark's figures and the challenge's answer: its rows as the form defines them (the sum's rows reduced
    mod common.challenge.P, or the rounds' digests), each a 1-D array of unsigned 64-bit values."""

    figures: BenchmarkFigures
    rows: AnswerRows


class GpuBenchmark(Protocol):
    simulated: bool
    forms: tuple[str, ...]  # the challenge forms it answers besides "sum" (the hello's challenge_forms)

    def run(self, task: ChallengeTask) -> BenchmarkRun:
        """Measure the GPU ``task.gpu_uuid`` and compute the challenge; blocking (the agent calls it in a thread).
        Raises BenchmarkUnavailable when it cannot run."""
        ...
