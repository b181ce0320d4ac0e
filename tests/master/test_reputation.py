"""Reputation v1: a score in [0, 1] from uptime and command success, with its components visible."""

from master.records import AgentRecord
from master.reputation import reputation


def agent(**counters) -> AgentRecord:
    return AgentRecord(id="agt-1", provider="p", state="ready", **counters)


def test_a_new_agent_starts_in_the_middle():
    rep = reputation(agent())
    assert rep.score == 0.5
    assert rep.components == {"uptime": 0.5, "command_success": 0.5}


def test_uptime_and_successes_raise_the_score_and_failures_lower_it():
    good = reputation(agent(uptime_s=86400, commands_succeeded=50))
    bad = reputation(agent(uptime_s=3600, downtime_s=20000, commands_failed=20))
    assert good.score > 0.95
    assert bad.score < 0.2
    assert 0 <= bad.score <= good.score <= 1


def test_the_score_is_explained_by_its_components_and_evidence():
    rep = reputation(agent(uptime_s=1000, downtime_s=100, commands_succeeded=3, commands_failed=1))
    assert abs(rep.score - sum(rep.weights[k] * v for k, v in rep.components.items())) < 1e-3
    assert rep.evidence["commands_failed"] == 1
