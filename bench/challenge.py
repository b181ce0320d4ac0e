"""``python -m bench challenge``: what the Master's check of a verification challenge costs (master/verification.py).

For each form, an honest answer is computed here (the simulated benchmark's code), committed, opened as the Master asks,
and the Master's ``ChallengeBook.check`` is timed: CPU per check (the median of ``runs``), and the longest stall of an
event loop that ticks every millisecond while the check runs in a thread (``asyncio.to_thread``, as the Master runs
it). The rounds form's check recomputes ``round_rows_checked * rounds_per_row`` whole rounds, whatever the challenge's
number of rounds (only the Merkle path grows, by a hash per doubling), so a short challenge of the default n and k
measures what a real one costs. The sum form is timed at its default shape, with the vectorized check and with the
scalar specification (one multiply-add at a time: the check before numpy).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from agent.benchmark.responder import VerificationResponder
from agent.benchmark.simulated import SimulatedBenchmark
from common.catalog import CATALOG
from common.challenge import FORM_ROUNDS, FORM_SUM, Shape, answer_entry
from common.wire import VerifyOpen, VerifyReveal
from master.verification import ChallengeBook, ChallengeSettings

UUID = "GPU-bench-0"
TICK_S = 0.001


@dataclass(frozen=True)
class ChallengeBenchOptions:
    round_n: int = 512  # the rounds form's default shape (ChallengeSettings)
    round_k: int = 1024
    rounds: int = 64  # a short challenge: its answer is computed here, once
    sum_n: int = 1024  # the sum form's default shape
    sum_k: int = 4096
    sum_rounds: int = 4
    runs: int = 3


@dataclass(frozen=True)
class CheckFigures:
    form: str
    shape: str
    recomputed: str
    cpu_ms: float
    loop_stall_ms: float


def _opened(form: str, shape: Shape, settings: ChallengeSettings, seed: int) -> tuple[ChallengeBook, VerifyOpen]:
    """A book with one challenge of ``shape``, committed and opened honestly."""
    clock = [0.0]
    book = ChallengeBook(settings, min_throughput_fraction=0.6, rng=random.Random(seed))
    bench = SimulatedBenchmark({UUID: CATALOG["h100-sxm"]}, clock=lambda: clock[0], sleep=lambda s: None)

    async def held() -> set[str]:
        return set()

    responder = VerificationResponder(bench, "", held)
    challenge = book.start("bench", UUID, CATALOG["h100-sxm"], 0.0, simulated=True, forms=frozenset({form}) - {FORM_SUM})
    assert challenge.form == form
    committed = asyncio.run(responder.on_challenge(challenge))
    reveal = book.on_commit("bench", committed, 0.0)
    assert isinstance(reveal, VerifyReveal), reveal
    opened = responder.on_reveal(reveal)
    assert opened is not None
    return book, opened


def _timed_check(form: str, shape: Shape, settings: ChallengeSettings, runs: int) -> tuple[float, float]:
    """(median CPU ms of a check, longest loop stall ms while one runs in a thread)."""
    cpu = []
    for run in range(runs):
        book, opened = _opened(form, shape, settings, seed=run)
        started = time.process_time()
        assert book.check("bench", opened) == ""
        cpu.append((time.process_time() - started) * 1e3)
    book, opened = _opened(form, shape, settings, seed=runs)
    return statistics.median(cpu), asyncio.run(_loop_stall(book, opened)) * 1e3


async def _loop_stall(book: ChallengeBook, opened: VerifyOpen) -> float:
    stall, done = 0.0, asyncio.Event()

    async def tick() -> None:
        nonlocal stall
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            stall = max(stall, now - last - TICK_S)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)  # the ticker's first ticks
    assert await asyncio.to_thread(book.check, "bench", opened) == ""
    done.set()
    await ticker
    return stall


def run_challenge_bench(options: ChallengeBenchOptions) -> dict[str, Any]:
    defaults = ChallengeSettings()
    checked_rounds = defaults.round_rows_checked * defaults.rounds_per_row
    # One row of digests holds the whole short challenge: the check opens it and recomputes as many rounds as the
    # default settings recompute across their rows.
    rounds_settings = ChallengeSettings(
        sim_n=options.round_n,
        sim_k=options.round_k,
        sim_rounds=options.rounds,
        round_rows_checked=1,
        rounds_per_row=min(checked_rounds, options.rounds),
    )
    sum_shape = Shape(options.sum_n, options.sum_k, options.sum_rounds)
    sum_settings = ChallengeSettings(sim_n=sum_shape.n, sim_k=sum_shape.k, sim_rounds=sum_shape.rounds)
    figures = []
    round_shape = Shape(options.round_n, options.round_k, options.rounds)
    cpu, stall = _timed_check(FORM_ROUNDS, round_shape, rounds_settings, options.runs)
    figures.append(CheckFigures(FORM_ROUNDS, _text(round_shape), f"{rounds_settings.rounds_per_row} rounds", cpu, stall))
    cpu, stall = _timed_check(FORM_SUM, sum_shape, sum_settings, options.runs)
    entries = sum_settings.rows_checked * sum_settings.entries_per_row
    figures.append(CheckFigures(FORM_SUM, _text(sum_shape), f"{entries} entries", cpu, stall))
    started = time.process_time()
    for i in range(entries):
        answer_entry(12345, sum_shape, i, i)
    scalar = (time.process_time() - started) * 1e3
    figures.append(CheckFigures(f"{FORM_SUM} (scalar, before numpy)", _text(sum_shape), f"{entries} entries", scalar, 0.0))
    return {"options": options.__dict__, "checks": [f.__dict__ for f in figures]}


def _text(shape: Shape) -> str:
    return f"{shape.n} x {shape.k} x {shape.rounds}"


def challenge_table(result: dict[str, Any]) -> str:
    lines = ["form | shape (n x k x rounds) | recomputed | CPU per check ms | longest loop stall ms", "---|---|---|---|---"]
    for c in result["checks"]:
        stall = f"{c['loop_stall_ms']:.1f}" if c["loop_stall_ms"] else "-"
        lines.append(f"{c['form']} | {c['shape']} | {c['recomputed']} | {c['cpu_ms']:.1f} | {stall}")
    return "\n".join(lines)
