"""The agent's command ledger (agent/ledger.py) bounds the refused ids it keeps: anyone on the path can make refusals
(a relay forging commands, each with a new id), so past the bound the oldest acknowledged refusals are forgotten, while
every run's record and every refusal the Master has not acknowledged yet are kept."""

from __future__ import annotations

from agent import ledger as ledger_module
from agent.ledger import REFUSED_PREFIX, CommandLog


def test_refused_ids_past_the_bound_forget_the_oldest_acknowledged_and_keep_runs_and_unacknowledged(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_module, "REFUSED_KEPT", 3)
    log = CommandLog(tmp_path / "commands.db")
    try:
        log.start("run-1", "create_container")
        log.finish("run-1", "create_container", ok=False, result={}, error="image not found", error_code="image")
        log.mark_acked("run-1")
        for n in range(5):
            entry = log.refuse(
                f"forged-{n}", "create_container", error=f"{REFUSED_PREFIX}bad signature", error_code="bad_signature"
            )
            assert entry.finished and entry.ok is False
            if n < 4:
                log.mark_acked(f"forged-{n}")  # the last one's refusal is still on its way to the Master

        assert log.get("run-1") is not None  # a run is never forgotten
        assert log.get("forged-0") is None and log.get("forged-1") is None  # the oldest acknowledged, past the bound
        kept = [log.get(f"forged-{n}") for n in (2, 3, 4)]
        assert all(e is not None and e.error == f"{REFUSED_PREFIX}bad signature" for e in kept)
        assert [e.id for e in log.unacked()] == ["forged-4"]
        assert log.count() == 4
    finally:
        log.close()


def test_a_refusal_of_an_id_this_host_ran_keeps_the_run(tmp_path):
    log = CommandLog(tmp_path / "commands.db")
    try:
        log.start("cmd-1", "create_container")
        log.finish("cmd-1", "create_container", ok=True, result={"container": "c"}, error=None, error_code=None)
        entry = log.refuse("cmd-1", "create_container", error=f"{REFUSED_PREFIX}bad signature", error_code="bad_signature")
        assert entry.ok is True and entry.result == {"container": "c"}
    finally:
        log.close()
