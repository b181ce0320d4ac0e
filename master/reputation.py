"""Reputation v1: a score in [0, 1] from uptime and command success, every component visible."""

from __future__ import annotations

import msgspec

from master.records import AgentRecord

WEIGHTS = {"uptime": 0.5, "command_success": 0.5}


class Reputation(msgspec.Struct, kw_only=True):
    score: float
    components: dict[str, float]
    weights: dict[str, float]
    evidence: dict[str, float]


def reputation(agent: AgentRecord) -> Reputation:
    """Both components use a Beta(1, 1) prior so a new agent starts at 0.5 and evidence moves it."""
    up, down = agent.uptime_s, agent.downtime_s
    uptime = (up + 60.0) / (up + down + 120.0)  # one minute up and one down as the prior
    ok, failed = agent.commands_succeeded, agent.commands_failed
    success = (ok + 1.0) / (ok + failed + 2.0)
    components = {"uptime": round(uptime, 4), "command_success": round(success, 4)}
    score = sum(WEIGHTS[name] * value for name, value in components.items())
    return Reputation(
        score=round(min(1.0, max(0.0, score)), 4),
        components=components,
        weights=dict(WEIGHTS),
        evidence={"uptime_s": round(up, 1), "downtime_s": round(down, 1), "commands_succeeded": ok, "commands_failed": failed},
    )
