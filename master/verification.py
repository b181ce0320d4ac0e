"""Verification challenges: the Master's side, sans I/O. A GPU is verified by what it computes in time, not by what
its agent says.

One challenge per GPU at a time. States: ``sent`` (challenge out, waiting for the commit) -> ``revealed`` (commit
in time, rows named, waiting for the openings) -> an ``Outcome``. Every path ends in exactly one outcome:
- ``verified``: the commit came before the deadline, and every opened row matches the root and every checked entry
  matches the Master's own recomputation from the seed.
- ``failed`` with a code: ``late`` (no commit by the deadline: the card is slower than its claimed model, or the
  host stalled), ``wrong_answer`` (an opened entry or path does not match: a made-up or replayed answer),
  ``replayed`` (the root equals one this GPU committed before: the same answer to a fresh seed), ``no_opening`` (the
  commit came, the openings did not).
- ``refused``: the agent said why it did not run (the GPU is rented, the host has no benchmark); not a failure of
  the card, and the GPU keeps its previous verification.

The deadline is the Master's clock: ``allowance + work / (expected rate of the claimed model * fraction)``, with
the fraction the tier policy's ``min_throughput_fraction``. The form (common/challenge.py) is the agent's best: an
agent whose hello names the ``rounds`` form gets a challenge sized for its claimed model (``sized_shape``: a healthy
card of that model computes for ``work_ratio`` times the allowance, so the card's speed decides, not the allowance),
and the Master recomputes a few whole rounds; older agents get the small ``sum`` shape, which only a gross fake
misses. Inputs are the clock and a random source passed in, so every rule above is a unit test
(tests/master/test_verification.py, tests/master/test_challenge_sizing.py). What it proves: docs/verification.md.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from common.catalog import GpuModel, expected_figures
from common.challenge import (
    FORM_ROUNDS,
    FORM_SUM,
    MAX_ROUNDS,
    Shape,
    answer_entries,
    digest_width,
    path_matches,
    round_digest,
    weights,
)
from common.inventory import GpuInfo
from common.wire import BenchmarkFigures, VerifyChallenge, VerifyCommit, VerifyOpen, VerifyReveal
from master.records import GpuRecord, GpuVerification
from master.tiers import Classification

VERIFIED, FAILED, REFUSED = "verified", "failed", "refused"
REMEMBERED_ROOTS = 16  # roots kept per GPU, to name a replay as such


@dataclass(frozen=True)
class ChallengeSettings:
    """The challenge's shape and timing (MasterConfig ``verify_*``). A simulated GPU computes its answer on the CPU, so
    it gets a small shape and a time scale (``sim_rate_scale``) chosen so that its claimed model takes ``sim_target_s``:
    the deadline then judges it as it judges a real card."""

    # The sum form (agents that answer no other): a fixed small shape, since the Master's check of an entry costs
    # k * rounds multiply-adds; on a real card its work takes milliseconds and the allowance decides.
    n: int = 1024
    k: int = 4096
    rounds: int = 4
    rows_checked: int = 3  # rows the Master opens
    entries_per_row: int = 2  # entries recomputed in each opened row
    allowance_s: float = 5.0  # network, set-up and hashing on top of the computing time
    # The rounds form: rounds of n x k by k x n sized so that a healthy card of the claimed model computes for
    # work_ratio * round_allowance_s; the Master recomputes round_rows_checked * rounds_per_row whole rounds
    # (about 13 ms of CPU each at 512 x 1024 x 512, bench/README.md "challenge check").
    round_n: int = 512
    round_k: int = 1024  # at most common.challenge.ROUND_MAX_K
    work_ratio: float = 10.0
    round_allowance_s: float = 3.0  # set-up (NVRTC, the figures' probes), the digests' copy and hashing, the network
    round_rows_checked: int = 4
    rounds_per_row: int = 4
    open_timeout_s: float = 30.0  # after the reveal, for the openings
    sim_n: int = 16
    sim_k: int = 32
    sim_rounds: int = 4
    sim_target_s: float = 0.5  # how long a simulated card of its claimed model takes
    sim_allowance_s: float = 1.0


@dataclass(frozen=True)
class Outcome:
    challenge_id: str
    agent_id: str
    gpu_uuid: str
    model: str
    status: str  # VERIFIED | FAILED | REFUSED
    code: str  # "" when verified; "late", "wrong_answer", "replayed", "no_opening", "refused"
    reason: str  # a sentence for the operator and the provider
    started_at: float
    finished_at: float
    commit_s: float | None = None  # seconds from the challenge to its commit, by the Master's clock
    challenge_tflops: float | None = None  # the challenge's work over commit_s: a lower bound of the card's rate
    figures: BenchmarkFigures | None = None  # the agent's own figures, kept with the outcome


def expected_rate(model: GpuModel, form: str) -> float:
    """FLOP/s a healthy card of ``model`` computes ``form`` at: the rounds form's kernel has its own catalog figure."""
    figures = expected_figures(model)
    return (figures.challenge_tflops if form == FORM_ROUNDS else figures.tensor_tflops) * 1e12


def sized_shape(model: GpuModel, settings: ChallengeSettings) -> Shape:
    """The rounds form's shape for a claimed ``model``: as many rounds as a healthy card of it computes in
    ``work_ratio * round_allowance_s`` (at most MAX_ROUNDS: a card faster than that bound gets a shorter run)."""
    per_round = Shape(settings.round_n, settings.round_k, 1).flops
    target_s = settings.work_ratio * settings.round_allowance_s
    rounds = math.ceil(target_s * expected_rate(model, FORM_ROUNDS) / per_round)
    return Shape(settings.round_n, settings.round_k, min(max(rounds, 1), MAX_ROUNDS))


def separation_ratio(settings: ChallengeSettings, fraction: float) -> float:
    """How much slower than its claim a card must be for the rounds form's deadline to catch it, at the least (a card
    with no overhead at all): the claimed model computes for T = work_ratio * allowance, the deadline is allowance +
    T / fraction, and a card rho times slower takes rho * T, so it is late when rho > 1 / fraction + 1 / work_ratio.
    Models closer than this to each other (an H100 PCIe and SXM) are one class to the challenge."""
    return 1.0 / fraction + 1.0 / settings.work_ratio


@dataclass
class _Open:
    challenge: VerifyChallenge
    agent_id: str
    model: GpuModel
    shape: Shape
    started_at: float
    rate_scale: float
    form: str = FORM_SUM
    commit: VerifyCommit | None = None
    committed_at: float = 0.0
    rows: list[int] = field(default_factory=list)
    columns: dict[int, list[int]] = field(default_factory=dict)


class ChallengeBook:
    def __init__(self, settings: ChallengeSettings, *, min_throughput_fraction: float, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.fraction = min_throughput_fraction
        self._rng = rng or random.SystemRandom()
        self.open: dict[str, _Open] = {}  # challenge id -> its state
        self._roots: dict[str, deque[str]] = {}  # GPU uuid -> roots it committed lately

    def busy(self, gpu_uuid: str) -> bool:
        return any(o.challenge.gpu_uuid == gpu_uuid for o in self.open.values())

    def start(
        self,
        agent_id: str,
        gpu_uuid: str,
        model: GpuModel,
        now: float,
        *,
        simulated: bool = False,
        forms: frozenset[str] = frozenset(),
    ) -> VerifyChallenge:
        """A challenge for the GPU, in the best form the agent answers (``forms``: its hello's ``challenge_forms``)."""
        s = self.settings
        form = FORM_ROUNDS if FORM_ROUNDS in forms else FORM_SUM
        expected = expected_rate(model, form)
        if simulated:
            shape, allowance = Shape(s.sim_n, s.sim_k, s.sim_rounds), s.sim_allowance_s
            scale = shape.flops / (s.sim_target_s * expected)
        elif form == FORM_ROUNDS:
            shape, allowance, scale = sized_shape(model, s), s.round_allowance_s, 1.0
        else:
            shape, allowance, scale = Shape(s.n, s.k, s.rounds), s.allowance_s, 1.0
        rate = expected * self.fraction * scale
        challenge = VerifyChallenge(
            challenge_id=f"vc-{self._rng.getrandbits(64):016x}",
            gpu_uuid=gpu_uuid,
            seed=self._rng.getrandbits(63),
            n=shape.n,
            k=shape.k,
            rounds=shape.rounds,
            deadline=now + allowance + shape.flops / rate,
            sim_rate_scale=scale,
            form=form,
        )
        self.open[challenge.challenge_id] = _Open(challenge, agent_id, model, shape, now, scale, form)
        return challenge

    def on_commit(self, agent_id: str, commit: VerifyCommit, now: float) -> VerifyReveal | Outcome | None:
        """A commit from ``agent_id``: the rows to open, or the outcome. None: not a challenge of this agent's open."""
        state = self.open.get(commit.challenge_id)
        if state is None or state.agent_id != agent_id or state.commit is not None:
            return None
        if commit.refused:
            return self._end(state, now, REFUSED, "refused", f"the agent did not run the benchmark: {commit.refused}")
        if now > state.challenge.deadline:
            late_by = now - state.challenge.deadline
            return self._end(
                state,
                now,
                FAILED,
                "late",
                f"the answer came {late_by:.2f} s after the deadline ({now - state.started_at:.2f} s in all): "
                f"slower than a {state.model.name} computes it",
                commit=commit,
            )
        roots = self._roots.setdefault(state.challenge.gpu_uuid, deque(maxlen=REMEMBERED_ROOTS))
        if commit.root in roots:
            return self._end(
                state, now, FAILED, "replayed", "the answer is one this GPU gave to an earlier challenge", commit=commit
            )
        roots.append(commit.root)
        state.commit, state.committed_at = commit, now
        rows, rows_checked, per_row = self._checked(state)
        state.rows = self._rng.sample(range(rows), min(rows_checked, rows))
        for row in state.rows:
            width = _row_width(state, row)
            state.columns[row] = self._rng.sample(range(width), min(per_row, width))
        return VerifyReveal(challenge_id=commit.challenge_id, rows=list(state.rows))

    def _checked(self, state: _Open) -> tuple[int, int, int]:
        """(rows in the answer, rows to open, values to recompute in each) for the challenge's form."""
        s = self.settings
        if state.form == FORM_ROUNDS:
            return -(-state.shape.rounds // digest_width(state.shape)), s.round_rows_checked, s.rounds_per_row
        return state.shape.n, s.rows_checked, s.entries_per_row

    def on_open(self, agent_id: str, opened: VerifyOpen, now: float) -> Outcome | None:
        """The openings checked here and now (``check`` then ``conclude``, for a caller with no event loop to keep)."""
        wrong = self.check(agent_id, opened)
        return None if wrong is None else self.conclude(agent_id, opened, wrong, now)

    def check(self, agent_id: str, opened: VerifyOpen) -> str | None:
        """Why the openings do not prove the answer ("" when they do); None when they answer no open challenge of
        this agent. Reads the book only, and recomputes entries from the seed (CPU time: a thread's work)."""
        state = self.open.get(opened.challenge_id)
        if state is None or state.agent_id != agent_id or state.commit is None:
            return None
        return _first_wrong(state, opened)

    def conclude(self, agent_id: str, opened: VerifyOpen, wrong: str, now: float) -> Outcome | None:
        """The outcome of openings ``check`` judged; None if the challenge ended meanwhile."""
        state = self.open.get(opened.challenge_id)
        if state is None or state.agent_id != agent_id or state.commit is None:
            return None
        if wrong:
            return self._end(state, now, FAILED, "wrong_answer", wrong, commit=state.commit)
        return self._end(
            state,
            now,
            VERIFIED,
            "",
            f"answered a fresh challenge correctly in {state.committed_at - state.started_at:.2f} s "
            f"(deadline {state.challenge.deadline - state.started_at:.2f} s for a {state.model.name})",
            commit=state.commit,
        )

    def expire(self, now: float) -> list[Outcome]:
        """Challenges whose commit or openings will never count now."""
        outcomes = []
        for state in list(self.open.values()):
            if state.commit is None and now > state.challenge.deadline:
                outcomes.append(
                    self._end(
                        state,
                        now,
                        FAILED,
                        "late",
                        f"no answer by the deadline ({state.challenge.deadline - state.started_at:.2f} s for a "
                        f"{state.model.name}): slower than a {state.model.name} computes it, or the host stalled",
                    )
                )
            elif state.commit is not None and now > state.committed_at + self.settings.open_timeout_s:
                outcomes.append(
                    self._end(state, now, FAILED, "no_opening", "the answer was committed but its rows were never opened")
                )
        return outcomes

    def forget_agent(self, agent_id: str, now: float) -> list[Outcome]:
        """The agent went away: its open challenges end as refused (not the card's fault; asked again later)."""
        return [
            self._end(state, now, REFUSED, "disconnected", "the host disconnected during the challenge")
            for state in list(self.open.values())
            if state.agent_id == agent_id
        ]

    def _end(
        self, state: _Open, now: float, status: str, code: str, reason: str, *, commit: VerifyCommit | None = None
    ) -> Outcome:
        del self.open[state.challenge.challenge_id]
        commit_s = (state.committed_at or now) - state.started_at if commit is not None else None
        return Outcome(
            challenge_id=state.challenge.challenge_id,
            agent_id=state.agent_id,
            gpu_uuid=state.challenge.gpu_uuid,
            model=state.model.key,
            status=status,
            code=code,
            reason=reason,
            started_at=state.started_at,
            finished_at=now,
            commit_s=round(commit_s, 3) if commit_s is not None else None,
            challenge_tflops=(
                _significant(state.shape.flops / commit_s / 1e12 / state.rate_scale)
                if status == VERIFIED and commit_s and commit_s > 0
                else None
            ),
            figures=commit.figures if commit is not None else None,
        )


def _row_width(state: _Open, row: int) -> int:
    """How many values row ``row`` of the answer holds: n for the sum form; the rounds form's last row may be short."""
    if state.form != FORM_ROUNDS:
        return state.shape.n
    width = digest_width(state.shape)
    return min(width, state.shape.rounds - row * width)


def _first_wrong(state: _Open, opened: VerifyOpen) -> str:
    """Why the openings do not prove the answer; "" when they do. Checks every path first (cheap), then recomputes
    the picked values: the sum form's entries in one vectorized pass, the rounds form's rounds one by one."""
    by_row = {o.row: o for o in opened.openings}
    assert state.commit is not None
    for row in state.rows:
        opening = by_row.get(row)
        if opening is None:
            return f"row {row} was not opened"
        if len(opening.values) != _row_width(state, row) or not path_matches(
            state.commit.root, row, opening.values, opening.path
        ):
            return f"row {row} does not match the committed answer"
    seed, shape = state.challenge.seed, state.shape
    if state.form == FORM_ROUNDS:
        w = weights(seed, shape.n)
        width = digest_width(shape)
        for row in state.rows:
            for col in state.columns[row]:
                r = row * width + col
                if by_row[row].values[col] != round_digest(seed, shape, r, w):
                    return f"round {r}'s digest is not that of the product of its matrices"
        return ""
    cells = [(row, col) for row in state.rows for col in state.columns[row]]
    expected = answer_entries(seed, shape, cells)
    for row, col in cells:
        if by_row[row].values[col] != expected[row, col]:
            return f"entry ({row}, {col}) is not the product of the challenge's matrices"
    return ""


# -- what a verification means for a GPU's tier, flags and offers ---------------------------------------------------

VERIFICATION_FAILED_FLAG = "verification_failed"
# Flags that say the card is not what it claims, by measurement: such a GPU is not offered (management's units) and
# gets no tier, until a later run passes.
MEASURED_FLAGS = frozenset({VERIFICATION_FAILED_FLAG, "throughput_below_catalog", "bandwidth_below_catalog"})


def verification_of(outcome: Outcome, *, simulated: bool, driver_version: str) -> GpuVerification:
    return GpuVerification(
        status=outcome.status,
        code=outcome.code,
        reason=outcome.reason,
        at=outcome.finished_at,
        simulated=simulated,
        driver_version=driver_version,
        commit_s=outcome.commit_s,
        challenge_tflops=outcome.challenge_tflops,
        figures=outcome.figures,
    )


def carried(old: GpuVerification | None, info: GpuInfo) -> GpuVerification | None:
    """What a new inventory report keeps of a GPU's verification: nothing once its driver changed (run again)."""
    if old is None or old.driver_version != info.driver_version:
        return None
    return old


def measured_of(verification: GpuVerification | None) -> dict[str, float]:
    """The figures the tier policy compares with the catalog: only those of a run whose challenge passed (a failed
    run's figures are the host's word alone)."""
    if verification is None or verification.status != VERIFIED or verification.figures is None:
        return {}
    figures = verification.figures
    candidates = {
        "fp16_tflops": figures.fp16_tflops,
        "bf16_tflops": figures.bf16_tflops,
        "memory_bandwidth_gbs": figures.memory_bandwidth_gbs,
    }
    return {key: value for key, value in candidates.items() if value is not None}


def judged(classification: Classification, verification: GpuVerification | None) -> tuple[str | None, list[str], list[str]]:
    """(tier, flags, reasons) of a GPU given its catalog classification and its latest verification."""
    flags, reasons = list(classification.flags), list(classification.reasons)
    if verification is not None and verification.status == FAILED:
        flags.append(VERIFICATION_FAILED_FLAG)
        reasons.append(f"verification failed ({verification.code}): {verification.reason}")
    tier = None if flags else classification.tier
    return tier, flags, reasons


def measured_verified(gpu: GpuRecord) -> bool:
    """Whether ``gpu`` is verified by measurement: a passed challenge on a real card, and nothing flagged."""
    v = gpu.verification
    passed = v is not None and v.status == VERIFIED and not v.simulated
    return passed and not gpu.info.simulated and not gpu.flags and gpu.tier is not None


def verification_label(gpu: GpuRecord) -> str:
    """What the API and the console show: "verified", "simulated", "failed: late", "unmeasured", ..."""
    v = gpu.verification
    if gpu.info.simulated or (v is not None and v.simulated):
        return "simulated" if v is None or v.status != FAILED else f"simulated, failed: {v.code}"
    if v is None or v.status == REFUSED:
        return "unmeasured"
    return "verified" if measured_verified(gpu) else f"failed: {v.code}" if v.status == FAILED else "flagged"


def measured_rate(gpu: GpuRecord) -> tuple[float | None, float | None]:
    """(dense tensor TFLOP/s, device memory GB/s) of the GPU's latest passed run; (None, None) when it has none."""
    v = gpu.verification
    if v is None or v.status != VERIFIED or v.figures is None:
        return None, None
    tensor = max(v.figures.bf16_tflops or 0.0, v.figures.fp16_tflops or 0.0)
    return (tensor or None), v.figures.memory_bandwidth_gbs


def _significant(value: float) -> float:
    """Three significant digits: a real card's default challenge runs at a few hundredths of a TFLOP/s (its work takes
    milliseconds, the commit's time is mostly set-up), which one decimal place showed as 0.0."""
    return float(f"{value:.3g}")
