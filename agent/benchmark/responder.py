"""The agent's side of a verification challenge: run the benchmark, commit, and open the rows the Master names.

Rules (each a test in tests/agent/test_benchmark.py):
- A challenge for a GPU a renter's container holds is refused (``VerifyCommit.refused``): a benchmark never runs on
  a rented GPU, whatever the Master asks. A challenge for a GPU already being benchmarked is refused too.
- The answer's rows are kept until the Master's reveal (at most ``MAX_KEPT`` challenges, oldest dropped), and each
  reveal is answered once: the rows of an answer are opened only after its root was sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from agent.benchmark.interface import BenchmarkUnavailable, ChallengeTask, GpuBenchmark
from common.challenge import FORM_SUM, AnswerRows, ChallengeShapeError, Commitment, Shape, check_form, commit
from common.wire import VerifyChallenge, VerifyCommit, VerifyOpen, VerifyOpening, VerifyReveal

log = logging.getLogger(__name__)

MAX_KEPT = 8  # answers kept for their reveal
MAX_OPENED_ROWS = 16  # rows one reveal may ask for (each row is n integers on the wire)

HeldGpus = Callable[[], Awaitable[set[str]]]  # uuids of the GPUs renters' containers hold now


class VerificationResponder:
    def __init__(self, benchmark: GpuBenchmark | None, unavailable: str, held_gpus: HeldGpus) -> None:
        """``benchmark`` None: this host cannot benchmark, and ``unavailable`` says why (sent as the refusal)."""
        self.benchmark = benchmark
        self._unavailable = unavailable
        self._held_gpus = held_gpus
        self.running: set[str] = set()  # GPUs being benchmarked now
        self._kept: OrderedDict[str, tuple[Commitment, AnswerRows]] = OrderedDict()

    @property
    def forms(self) -> tuple[str, ...]:
        """The challenge forms this host answers besides "sum" (its hello says so)."""
        return self.benchmark.forms if self.benchmark is not None else ()

    async def on_challenge(self, challenge: VerifyChallenge) -> VerifyCommit:
        refusal = await self._refusal(challenge)
        if refusal:
            log.info("verification challenge refused", extra={"gpu": challenge.gpu_uuid, "why": refusal})
            return VerifyCommit(challenge_id=challenge.challenge_id, refused=refusal)
        assert self.benchmark is not None  # _refusal said so
        try:
            task = ChallengeTask(
                challenge.challenge_id,
                challenge.gpu_uuid,
                challenge.seed,
                Shape(challenge.n, challenge.k, challenge.rounds),
                challenge.deadline,
                challenge.sim_rate_scale,
                challenge.form,
            )
            check_form(task.shape, task.form)
        except ChallengeShapeError as exc:
            return VerifyCommit(challenge_id=challenge.challenge_id, refused=str(exc))
        if challenge.form != FORM_SUM and challenge.form not in self.forms:
            why = f"this host's benchmark does not answer the {challenge.form!r} challenge form"
            return VerifyCommit(challenge_id=challenge.challenge_id, refused=why)
        self.running.add(challenge.gpu_uuid)
        try:
            run = await asyncio.to_thread(self.benchmark.run, task)
            commitment = await asyncio.to_thread(commit, run.rows)
        except BenchmarkUnavailable as exc:
            return VerifyCommit(challenge_id=challenge.challenge_id, refused=str(exc))
        finally:
            self.running.discard(challenge.gpu_uuid)
        self._kept[challenge.challenge_id] = (commitment, run.rows)
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
        return VerifyCommit(challenge_id=challenge.challenge_id, root=commitment.root, figures=run.figures)

    def on_reveal(self, reveal: VerifyReveal) -> VerifyOpen | None:
        """The named rows, opened; None when this agent kept no answer of that id (restarted, or answered already)."""
        kept = self._kept.pop(reveal.challenge_id, None)
        if kept is None:
            return None
        commitment, rows = kept
        openings = [
            VerifyOpening(row=row, values=[int(v) for v in rows[row]], path=commitment.path(row))
            for row in reveal.rows[:MAX_OPENED_ROWS]
            if 0 <= row < len(rows)
        ]
        return VerifyOpen(challenge_id=reveal.challenge_id, openings=openings)

    async def _refusal(self, challenge: VerifyChallenge) -> str:
        if self.benchmark is None:
            return self._unavailable or "this agent has no GPU benchmark"
        if challenge.gpu_uuid in self.running:
            return f"GPU {challenge.gpu_uuid} is being benchmarked already"
        if challenge.gpu_uuid in await self._held_gpus():
            return f"GPU {challenge.gpu_uuid} is held by a renter's container; a benchmark never runs on a rented GPU"
        return ""
