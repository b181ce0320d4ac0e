"""The agent's benchmark and its side of the challenge. No GPU here: the CUDA path is checked only for the clear
refusal it gives without its ``gpu`` extra; the simulated benchmark stands in for the card everywhere else."""

from __future__ import annotations

import asyncio
import sys

from agent.benchmark.cuda import INSTALL_HINT, open_benchmark
from agent.benchmark.responder import VerificationResponder
from agent.benchmark.setup import open_responder
from agent.benchmark.simulated import SimulatedBenchmark
from agent.simulate import SimulatedCollector
from common.catalog import CATALOG
from common.challenge import MAX_N, path_matches
from common.wire import VerifyChallenge, VerifyReveal

UUID = "GPU-sim-0"


async def nothing_held() -> set[str]:
    return set()


def challenge(**fields) -> VerifyChallenge:
    shape = {"n": 6, "k": 8, "rounds": 2, "sim_rate_scale": 1e9} | fields  # scale: no time taken
    return VerifyChallenge(challenge_id="vc-1", gpu_uuid=UUID, seed=11, deadline=1e12, **shape)


def responder() -> VerificationResponder:
    return VerificationResponder(SimulatedBenchmark({UUID: CATALOG["l4"]}), "", nothing_held)


def test_without_the_gpu_extra_the_real_benchmark_says_what_to_install(monkeypatch):
    """The gpu extra is installed for the tests (the kernels' NVRTC test needs it): its absence is played by hiding
    the package from the import system, as on a provider's host that never installed it."""
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    benchmark, why = open_benchmark()
    assert benchmark is None and INSTALL_HINT in why


def test_a_host_without_a_benchmark_refuses_challenges_with_the_reason():
    refusing = VerificationResponder(None, "install the gpu extra", nothing_held)
    commit = asyncio.run(refusing.on_challenge(challenge()))
    assert commit.refused == "install the gpu extra" and commit.root == ""


def test_a_challenge_too_large_is_refused_not_run():
    commit = asyncio.run(responder().on_challenge(challenge(n=MAX_N + 1)))
    assert "challenge n must be" in commit.refused


def test_a_form_the_benchmark_does_not_answer_is_refused_not_miscomputed():
    class SumOnly(SimulatedBenchmark):
        forms: tuple[str, ...] = ()

    answering = VerificationResponder(SumOnly({UUID: CATALOG["l4"]}), "", nothing_held)
    assert answering.forms == ()
    commit = asyncio.run(answering.on_challenge(challenge(form="rounds")))
    assert "does not answer the 'rounds' challenge form" in commit.refused and commit.root == ""
    assert asyncio.run(responder().on_challenge(challenge(form="rounds"))).root  # the simulated benchmark answers it


def test_the_rows_named_are_opened_once_against_the_committed_root():
    answering = responder()
    commit = asyncio.run(answering.on_challenge(challenge()))
    assert commit.figures is not None and commit.figures.simulated and commit.figures.bf16_tflops == 96.8
    opened = answering.on_reveal(VerifyReveal(challenge_id="vc-1", rows=[0, 5, 99]))
    assert opened is not None and [o.row for o in opened.openings] == [0, 5]  # a row out of range is skipped
    assert all(path_matches(commit.root, o.row, o.values, o.path) for o in opened.openings)
    assert answering.on_reveal(VerifyReveal(challenge_id="vc-1", rows=[1])) is None  # answered already


def test_a_simulated_host_answers_with_the_simulated_benchmark_and_a_gpu_less_one_with_none():
    gpus = SimulatedCollector("h100:2", seed=1).inventory()
    _, kind = open_responder(gpus, simulated=True, cheat="", held_gpus=nothing_held)
    assert kind == "simulated"
    answering, kind = open_responder([], simulated=False, cheat="", held_gpus=nothing_held)
    assert kind == "" and answering.benchmark is None
