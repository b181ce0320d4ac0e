"""The rounds form's sizing and deadline: a healthy card of the claimed model computes for ``work_ratio`` times the
allowance, so the deadline separates a card from the next lesser class of the catalog (an L40S answering as an H100,
an A10 as an A100), not only a CPU from a GPU.

No GPU here. Two views of the same rule, both at the catalog's expected figures (calibrated where a card was lent):
- the Master's real sizing, as arithmetic: the time a card of each model needs for the claimed model's real shape
  against the deadline the book sets;
- the protocol end to end with the simulated benchmark on a virtual clock: the simulator can compute only small shapes,
  so the simulated regime is set to the real one's proportions (the claimed card computes for work_ratio x the
  allowance) and the simulated card runs at the performing model's expected rate, as a real one would.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.benchmark.responder import VerificationResponder
from agent.benchmark.simulated import SimulatedBenchmark, SimulatedCheat
from common.catalog import (
    CATALOG,
    CHALLENGE_EFFICIENCY,
    GpuModel,
    challenge_peak,
    compute_capability,
    expected_figures,
)
from common.challenge import FORM_ROUNDS, MAX_ROUNDS
from common.wire import VerifyReveal
from master.verification import (
    FAILED,
    VERIFIED,
    ChallengeBook,
    ChallengeSettings,
    Outcome,
    expected_rate,
    separation_ratio,
    sized_shape,
)

SETTINGS = ChallengeSettings()
FRACTION = 0.6  # the default tier policy's min_throughput_fraction
RESOLUTION = separation_ratio(SETTINGS, FRACTION)
# AMD's cards are never challenged (no ROCm benchmark yet: they stay "unmeasured"), and a V100 (compute capability
# 7.0) has no mma.sync of the rounds kernel's shapes (it answers the sum form only): the classes are the other NVIDIA
# models'.
MEASURED = sorted(
    (m for m in CATALOG.values() if m.vendor == "nvidia" and compute_capability(m) >= (7, 5)),
    key=lambda m: -expected_rate(m, FORM_ROUNDS),
)
UUID = "GPU-sim-0"


def next_lesser(claimed: GpuModel) -> GpuModel | None:
    """The fastest catalog card the deadline must catch answering as ``claimed``: the hardest case of the class below."""
    bound = expected_rate(claimed, FORM_ROUNDS) / RESOLUTION
    return next((m for m in MEASURED if expected_rate(m, FORM_ROUNDS) <= bound), None)


ADJACENT = [(claimed, lesser) for claimed in MEASURED if (lesser := next_lesser(claimed)) is not None]


def test_the_classes_the_issue_names_are_told_apart() -> None:
    pairs = {(c.key, lesser.key) for c, lesser in ADJACENT}
    assert expected_rate(CATALOG["l40s"], FORM_ROUNDS) * RESOLUTION <= expected_rate(CATALOG["h100-sxm"], FORM_ROUNDS)
    assert expected_rate(CATALOG["a10"], FORM_ROUNDS) * RESOLUTION <= expected_rate(CATALOG["a100-80gb"], FORM_ROUNDS)
    assert {("h100-sxm", "l40s"), ("a100-80gb", "rtx-a6000")} <= pairs and len(ADJACENT) >= 10


@pytest.mark.parametrize("model", MEASURED, ids=lambda m: m.key)
def test_a_healthy_card_of_the_claimed_model_computes_for_work_ratio_times_the_allowance(model: GpuModel) -> None:
    shape = sized_shape(model, SETTINGS)
    assert shape.rounds < MAX_ROUNDS  # no model of the catalog is clipped by the bound
    seconds = shape.flops / expected_rate(model, FORM_ROUNDS)
    target = SETTINGS.work_ratio * SETTINGS.round_allowance_s
    assert target <= seconds < target * 1.01


@pytest.mark.parametrize(("claimed", "lesser"), ADJACENT, ids=lambda m: m.key)
def test_the_real_deadline_passes_the_claimed_card_and_fails_the_next_lesser_class(claimed: GpuModel, lesser: GpuModel) -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=FRACTION, rng=random.Random(1))
    challenge = book.start("agent-1", UUID, claimed, 0.0, forms=frozenset({FORM_ROUNDS}))
    assert challenge.form == FORM_ROUNDS
    work = 2.0 * challenge.n * challenge.n * challenge.k * challenge.rounds
    # the claimed card, even one that needs the whole allowance for its set-up, is in time
    assert SETTINGS.round_allowance_s + work / expected_rate(claimed, FORM_ROUNDS) <= challenge.deadline
    # the lesser card is late with no set-up at all
    assert work / expected_rate(lesser, FORM_ROUNDS) > challenge.deadline


def test_an_agent_that_names_no_form_gets_the_small_sum_challenge() -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=FRACTION, rng=random.Random(1))
    challenge = book.start("agent-1", UUID, CATALOG["h100-sxm"], 0.0)
    assert (challenge.form, challenge.n, challenge.k, challenge.rounds) == ("sum", SETTINGS.n, SETTINGS.k, SETTINGS.rounds)


# -- the protocol on a virtual clock, the simulated regime at the real one's proportions --------------------------

PROPORTIONAL = ChallengeSettings(
    sim_n=8,
    sim_k=8,
    sim_rounds=6,
    sim_target_s=SETTINGS.work_ratio * SETTINGS.round_allowance_s,
    sim_allowance_s=SETTINGS.round_allowance_s,
)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def simulated_run(claimed: GpuModel, performs: GpuModel) -> Outcome:
    clock = VirtualClock()
    book = ChallengeBook(PROPORTIONAL, min_throughput_fraction=FRACTION, rng=random.Random(11))
    cheat = SimulatedCheat(performs_as=performs if performs is not claimed else None)
    bench = SimulatedBenchmark({UUID: claimed}, cheat, clock=clock, sleep=clock.sleep)

    async def exchange() -> Outcome:
        async def held() -> set[str]:
            return set()

        responder = VerificationResponder(bench, "", held)
        challenge = book.start("agent-1", UUID, claimed, clock.now, simulated=True, forms=frozenset(responder.forms))
        assert challenge.form == FORM_ROUNDS
        step = book.on_commit("agent-1", await responder.on_challenge(challenge), clock.now)
        if isinstance(step, Outcome):
            return step
        assert isinstance(step, VerifyReveal)
        opened = responder.on_reveal(step)
        assert opened is not None
        outcome = book.on_open("agent-1", opened, clock.now)
        assert outcome is not None
        return outcome

    return asyncio.run(exchange())


@pytest.mark.parametrize(("claimed", "lesser"), ADJACENT, ids=lambda m: m.key)
def test_a_simulated_card_at_the_claimed_speed_passes_and_one_at_the_next_lesser_speed_is_late(
    claimed: GpuModel, lesser: GpuModel
) -> None:
    honest = simulated_run(claimed, claimed)
    assert honest.status == VERIFIED, honest.reason
    cheat = simulated_run(claimed, lesser)
    assert (cheat.status, cheat.code) == (FAILED, "late"), cheat.reason


@settings(deadline=None)
@given(st.sampled_from(MEASURED), st.sampled_from(MEASURED))
def test_any_pair_of_the_catalog_is_judged_by_its_speed_ratio(claimed: GpuModel, performs: GpuModel) -> None:
    ratio = expected_rate(claimed, FORM_ROUNDS) / expected_rate(performs, FORM_ROUNDS)
    outcome = simulated_run(claimed, performs)
    if ratio > RESOLUTION:
        assert outcome.code == "late"
    elif ratio <= 1 / FRACTION:
        assert outcome.status == VERIFIED, outcome.reason


def test_the_catalogs_challenge_figure_follows_the_kernels_path_until_calibrated() -> None:
    """INT8 from compute capability 8.0 (a GeForce card's INT8 rate is four times its FP32-accumulate FP16 figure, and
    the challenge must expect what the card's fastest exact path does), FP16 on a T4 (the kernel's Turing path)."""
    assert challenge_peak(CATALOG["rtx-4090"]) == CATALOG["rtx-4090"].int8_tops > 3.9 * CATALOG["rtx-4090"].fp16_tflops
    a10, t4 = expected_figures(CATALOG["a10"]), expected_figures(CATALOG["t4"])
    assert a10.challenge_tflops == round(CATALOG["a10"].int8_tops * CHALLENGE_EFFICIENCY, 1)
    assert t4.challenge_tflops == round(CATALOG["t4"].fp16_tflops * CHALLENGE_EFFICIENCY, 1)
