"""Reputation: a host's score in [0, 1], a weighted sum of components, each shown with the evidence behind it.

Every component is computed from running counters on the AgentRecord (no store read, no GPU list), so the
scheduler can score 10,000 hosts per cycle. Components, with the prior a host without evidence starts from:

- ``uptime``: seconds answering / (answering + silent), with one minute of each as the prior (starts at 0.5).
- ``command_success``: commands the host carried out / all it answered, Beta(1, 1) prior (0.5).
- ``container_success``: containers created that started / all creates answered, Beta(1, 1) prior (0.5).
- ``rentals``: rentals that ended without a host failure / all that ended, Beta(1, 1) prior (0.5). A rental that
  failed through the host (a container that would not start, the host offline mid-run, a GPU fault) counts against.
- ``verification``: over the GPUs of its latest inventory, a GPU verified by measurement (a passed challenge on a
  real card, tiered, nothing flagged: master/verification.py) counts 1; one not measured yet, a simulated one, or one
  no tier matched (but nothing flagged) 0.5; a flagged one (unknown model, VRAM mismatch, a failed challenge, measured
  figures under the catalog's, a duplicated uuid, ...) 0; the mean. Agreement with the catalog alone earns nothing
  above 0.5: any agent can report what the catalog says. A host that reported no GPU is 0.5.
- ``ratings``: renters' 1..5 ratings mapped to 0..1 ((r - 1) / 4), averaged with RATING_PRIOR pseudo-ratings of 3
  stars, so one rating moves it only part of the way: a single 1-star rating gives 0.4, a single 5 gives 0.6.

The weights (WEIGHTS) sum to 1: uptime counts most, then rentals that ended well; ratings and container starts next.
"""

from __future__ import annotations

import msgspec

from master.records import AgentRecord, GpuRecord
from master.verification import measured_verified

WEIGHTS = {
    "uptime": 0.30,
    "command_success": 0.10,
    "container_success": 0.15,
    "rentals": 0.20,
    "verification": 0.10,
    "ratings": 0.15,
}
COMPONENTS = tuple(WEIGHTS)
RATING_PRIOR = 4.0  # pseudo-ratings of 3 stars (0.5) every host starts with
UNVERIFIED_GPU = 0.5  # what a GPU no tier matched (and nothing flagged) counts in ``verification``


class Reputation(msgspec.Struct, kw_only=True):
    score: float
    components: dict[str, float]
    weights: dict[str, float]
    evidence: dict[str, float]


def _beta(good: float, bad: float) -> float:
    return (good + 1.0) / (good + bad + 2.0)


def verification_counts(gpus: list[GpuRecord]) -> tuple[int, int, int]:
    """(verified, unverified, flagged) among ``gpus``: what AgentRecord.gpus_* hold for the verification component."""
    verified = unverified = flagged = 0
    for gpu in gpus:
        if gpu.flags:
            flagged += 1
        elif measured_verified(gpu):
            verified += 1
        else:
            unverified += 1
    return verified, unverified, flagged


def components_of(agent: AgentRecord) -> dict[str, float]:
    """Each component's value, unrounded (the scheduler's score and the view's share this)."""
    up, down = agent.uptime_s, agent.downtime_s
    gpus = agent.gpus_verified + agent.gpus_unverified + agent.gpus_flagged
    rated = agent.ratings_count
    return {
        "uptime": (up + 60.0) / (up + down + 120.0),
        "command_success": _beta(agent.commands_succeeded, agent.commands_failed),
        "container_success": _beta(agent.containers_started, agent.containers_failed),
        "rentals": _beta(agent.rentals_completed, agent.rentals_failed),
        "verification": (agent.gpus_verified + UNVERIFIED_GPU * agent.gpus_unverified) / gpus if gpus else 0.5,
        "ratings": ((agent.ratings_sum - rated) / 4.0 + RATING_PRIOR * 0.5) / (rated + RATING_PRIOR),
    }


def score_of(components: dict[str, float]) -> float:
    return round(min(1.0, max(0.0, sum(WEIGHTS[name] * value for name, value in components.items()))), 4)


def reputation_score(agent: AgentRecord) -> float:
    """Only the score (what the scheduler reads per host and cycle): ``reputation(agent).score`` without building the
    components' and evidence's views; about half the cost."""
    return score_of(components_of(agent))


def reputation(agent: AgentRecord) -> Reputation:
    """The score, its components (rounded to 4 places) and the counters behind them."""
    components = components_of(agent)
    return Reputation(
        score=score_of(components),
        components={name: round(value, 4) for name, value in components.items()},
        weights=dict(WEIGHTS),
        evidence={
            "uptime_s": round(agent.uptime_s, 1),
            "downtime_s": round(agent.downtime_s, 1),
            "commands_succeeded": agent.commands_succeeded,
            "commands_failed": agent.commands_failed,
            "containers_started": agent.containers_started,
            "containers_failed": agent.containers_failed,
            "containers_refused": agent.containers_refused,  # the renter's fault (docs/images.md): not counted
            "rentals_completed": agent.rentals_completed,
            "rentals_failed": agent.rentals_failed,
            "gpus_verified": agent.gpus_verified,
            "gpus_unverified": agent.gpus_unverified,
            "gpus_flagged": agent.gpus_flagged,
            "ratings_count": agent.ratings_count,
            "rating_mean": round(agent.ratings_sum / agent.ratings_count, 2) if agent.ratings_count else 0.0,
        },
    )
