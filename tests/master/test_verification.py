"""The verification challenge end to end without sockets: the Master's book against the agent's responder, with the
simulated benchmark on a virtual clock (no GPU here: the simulator stands in for the card, as documented)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection

import pytest

from agent.benchmark.responder import VerificationResponder
from agent.benchmark.simulated import SimulatedBenchmark, SimulatedCheat
from common.catalog import CATALOG
from common.challenge import FORM_ROUNDS, FORM_SUM, FORMS, Shape, answer, answer_entry, answer_rows, commit, path_matches
from common.wire import VerifyCommit, VerifyOpen, VerifyOpening, VerifyReveal
from master.verification import FAILED, REFUSED, VERIFIED, ChallengeBook, ChallengeSettings, Outcome

H100 = CATALOG["h100-sxm"]
UUID = "GPU-sim-0"
# The simulated shape, timed so that an H100 takes sim_target_s of virtual time.
SETTINGS = ChallengeSettings(sim_n=12, sim_k=16, sim_rounds=3, sim_target_s=0.5, sim_allowance_s=1.0)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run_challenge(
    cheat: SimulatedCheat, *, book: ChallengeBook | None = None, held: Collection[str] = frozenset(), form: str = FORM_SUM
) -> Outcome:
    clock = VirtualClock()
    book = book or ChallengeBook(SETTINGS, min_throughput_fraction=0.6, rng=random.Random(7))
    bench = SimulatedBenchmark({UUID: H100}, cheat, clock=clock, sleep=clock.sleep)
    return asyncio.run(_exchange(book, bench, clock, held, form))


async def _exchange(
    book: ChallengeBook, bench: SimulatedBenchmark, clock: VirtualClock, held: Collection[str], form: str = FORM_SUM
) -> Outcome:
    async def held_gpus() -> set[str]:
        return set(held)

    responder = VerificationResponder(bench, "", held_gpus)
    forms = frozenset({form}) - {FORM_SUM}
    challenge = book.start("agent-1", UUID, H100, clock.now, simulated=True, forms=forms)
    assert challenge.form == form
    committed = await responder.on_challenge(challenge)
    step = book.on_commit("agent-1", committed, clock.now)
    if isinstance(step, Outcome):
        return step
    assert isinstance(step, VerifyReveal)
    opened = responder.on_reveal(step)
    assert opened is not None
    outcome = book.on_open("agent-1", opened, clock.now)
    assert outcome is not None
    return outcome


def test_the_answer_is_the_product_of_the_seeded_matrices_mod_p() -> None:
    shape = Shape(5, 7, 2)
    rows = answer(42, shape)
    assert all(rows[i][j] == answer_entry(42, shape, i, j) for i in range(5) for j in range(5))
    assert (answer(43, shape) != rows).any()  # a fresh seed, a fresh answer


def test_a_committed_row_opens_with_its_path_and_a_changed_one_does_not() -> None:
    rows = answer(1, Shape(7, 4, 1))
    committed = commit(rows)
    for i, row in enumerate(rows):
        assert path_matches(committed.root, i, row, committed.path(i))
    forged = [*rows[3]]
    forged[0] += 1
    assert not path_matches(committed.root, 3, forged, committed.path(3))
    assert not path_matches(committed.root, 3, rows[3], ["zz"])  # malformed hex is a mismatch, not an error


@pytest.mark.parametrize("form", FORMS)
def test_an_honest_card_is_verified_with_its_figures(form: str) -> None:
    outcome = run_challenge(SimulatedCheat(), form=form)
    assert outcome.status == VERIFIED, outcome.reason
    assert outcome.figures is not None and outcome.figures.simulated
    assert outcome.challenge_tflops is not None and outcome.challenge_tflops > 0


@pytest.mark.parametrize("form", FORMS)
def test_a_t4_claiming_to_be_an_h100_misses_the_deadline(form: str) -> None:
    outcome = run_challenge(SimulatedCheat(performs_as=CATALOG["t4"]), form=form)
    assert (outcome.status, outcome.code) == (FAILED, "late")
    assert "NVIDIA H100 SXM" in outcome.reason


@pytest.mark.parametrize("form", FORMS)
def test_a_late_answer_fails(form: str) -> None:
    outcome = run_challenge(SimulatedCheat(late=True), form=form)
    assert (outcome.status, outcome.code) == (FAILED, "late")


@pytest.mark.parametrize("form", FORMS)
def test_a_replayed_answer_fails_on_the_next_challenge(form: str) -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6, rng=random.Random(3))
    clock = VirtualClock()
    bench = SimulatedBenchmark({UUID: H100}, SimulatedCheat(replay=True), clock=clock, sleep=clock.sleep)
    first = asyncio.run(_exchange(book, bench, clock, set(), form))
    second = asyncio.run(_exchange(book, bench, clock, set(), form))
    assert first.status == VERIFIED  # the recorded run was honest
    assert (second.status, second.code) == (FAILED, "replayed")


def test_a_replayed_answer_under_a_new_root_fails_on_its_entries() -> None:
    """A cheat that stores an old answer and perturbs it, so its root is new: the recomputed entries expose it."""
    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6, rng=random.Random(5))
    challenge = book.start("agent-1", UUID, H100, 0.0, simulated=True)
    old = answer(challenge.seed + 1, Shape(SETTINGS.sim_n, SETTINGS.sim_k, SETTINGS.sim_rounds))
    committed = commit(old)
    reveal = book.on_commit("agent-1", VerifyCommit(challenge_id=challenge.challenge_id, root=committed.root), 0.1)
    assert isinstance(reveal, VerifyReveal)
    opened = VerifyOpen(
        challenge_id=challenge.challenge_id,
        openings=[VerifyOpening(row=r, values=old[r].tolist(), path=committed.path(r)) for r in reveal.rows],
    )
    outcome = book.on_open("agent-1", opened, 0.2)
    assert outcome is not None and (outcome.status, outcome.code) == (FAILED, "wrong_answer")


def test_a_rounds_answer_for_another_seed_under_a_new_root_fails_on_its_recomputed_rounds() -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6, rng=random.Random(5))
    challenge = book.start("agent-1", UUID, H100, 0.0, simulated=True, forms=frozenset({FORM_ROUNDS}))
    old = answer_rows(challenge.seed + 1, Shape(challenge.n, challenge.k, challenge.rounds), FORM_ROUNDS)
    committed = commit(old)
    reveal = book.on_commit("agent-1", VerifyCommit(challenge_id=challenge.challenge_id, root=committed.root), 0.1)
    assert isinstance(reveal, VerifyReveal)
    opened = VerifyOpen(
        challenge_id=challenge.challenge_id,
        openings=[VerifyOpening(row=r, values=old[r].tolist(), path=committed.path(r)) for r in reveal.rows],
    )
    outcome = book.on_open("agent-1", opened, 0.2)
    assert outcome is not None and (outcome.status, outcome.code) == (FAILED, "wrong_answer")
    assert "digest" in outcome.reason


def test_a_rounds_row_cut_short_does_not_match() -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6, rng=random.Random(5))
    challenge = book.start("agent-1", UUID, H100, 0.0, simulated=True, forms=frozenset({FORM_ROUNDS}))
    rows = answer_rows(challenge.seed, Shape(challenge.n, challenge.k, challenge.rounds), FORM_ROUNDS)
    short = [row[:-1] for row in rows]
    committed = commit(short)
    reveal = book.on_commit("agent-1", VerifyCommit(challenge_id=challenge.challenge_id, root=committed.root), 0.1)
    assert isinstance(reveal, VerifyReveal)
    opened = VerifyOpen(
        challenge_id=challenge.challenge_id,
        openings=[VerifyOpening(row=r, values=short[r].tolist(), path=committed.path(r)) for r in reveal.rows],
    )
    outcome = book.on_open("agent-1", opened, 0.2)
    assert outcome is not None and outcome.code == "wrong_answer" and "does not match" in outcome.reason


def test_a_gpu_a_renter_holds_is_never_benchmarked() -> None:
    outcome = run_challenge(SimulatedCheat(), held={UUID})
    assert (outcome.status, outcome.code) == (REFUSED, "refused")
    assert "held by a renter" in outcome.reason


def test_a_commit_that_never_comes_expires_as_late() -> None:
    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6)
    challenge = book.start("agent-1", UUID, H100, 0.0, simulated=True)
    assert book.expire(challenge.deadline - 0.01) == []
    (outcome,) = book.expire(challenge.deadline + 0.01)
    assert (outcome.status, outcome.code) == (FAILED, "late")
    assert not book.busy(UUID)


def test_only_the_challenged_agent_may_answer() -> None:
    from common.wire import VerifyCommit

    book = ChallengeBook(SETTINGS, min_throughput_fraction=0.6)
    challenge = book.start("agent-1", UUID, H100, 0.0, simulated=True)
    assert book.on_commit("agent-2", VerifyCommit(challenge_id=challenge.challenge_id, root="00"), 0.1) is None
    assert book.busy(UUID)


@pytest.mark.parametrize("text", ["as:nosuchgpu", "fast", "replay2"])
def test_an_unknown_cheat_is_a_one_line_error(text: str) -> None:
    from agent.errors import SimulationSpecError

    with pytest.raises(SimulationSpecError):
        SimulatedCheat.parse(text)
