"""The process runtime: real subprocesses, records that outlive the agent, whole sessions killed on delete."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import agent.runtime.process as process_module
from agent.runtime import open_runtime
from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.errors import ConfigError, RuntimeFailure

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def runtime(tmp_path):
    rt = ProcessRuntime(tmp_path / "state")
    yield rt
    for container in await ProcessRuntime(tmp_path / "state").list():  # what a failed test left running
        await rt.delete(container.name, timeout_s=0)


def labels(command_id):
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1"}


def shell(name, script, **fields):
    return ContainerSpec(name=name, image="none", command=["sh", "-c", script], **fields)


async def wait_until(predicate, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def file_text(path):
    """The whole file, once there: the scripts write a temporary file and rename it into place."""
    return path.exists() and path.read_text()


def publish(path, commands):
    return f"{{ {commands}; }} > {path}.tmp && mv {path}.tmp {path}"


def alive(pid):
    """Running, not a zombie (pid 1 here may be slow to reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def record(tmp_path, name):
    return json.loads((tmp_path / "state" / "containers" / f"{name}.json").read_text())


async def test_a_container_is_a_process_with_its_gpus_env_and_memory_limit(runtime, tmp_path):
    out = tmp_path / "seen"
    script = publish(out, "env; cat /proc/self/limits") + "; sleep 300"
    job = shell(
        "job",
        script,
        gpus=["GPU-a", "GPU-b"],
        memory_mib=64,
        env={"MODE": "train", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        labels={"team": "vision"},
    )
    info = await runtime.create(job, labels=labels("cmd-1"))

    assert (info.state, info.runtime, info.exit_code) == ("running", "process", None)
    assert info.labels[LABEL_COMMAND_ID] == "cmd-1" and info.labels["team"] == "vision"
    seen = await wait_until(lambda: file_text(out), "the command's env")
    assert "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b" in seen.splitlines()  # the spec's GPUs, whatever the renter's env said
    assert "MODE=train" in seen.splitlines()
    assert f"Max address space         {64 * 1024 * 1024}" in seen


async def test_a_container_without_gpus_sees_none_and_is_pinned_to_whole_cores(runtime, tmp_path):
    out = tmp_path / "seen"
    script = publish(out, "env; grep Cpus_allowed_list /proc/self/status") + "; sleep 300"
    await runtime.create(shell("cpu-job", script, cpus=0.5), labels=labels("cmd-2"))
    seen = (await wait_until(lambda: file_text(out), "the command's env")).splitlines()
    assert "CUDA_VISIBLE_DEVICES=" in seen
    allowed = seen[-1].split()[-1]
    assert allowed.isdigit() and int(allowed) in os.sched_getaffinity(0)  # half a CPU is one whole core


async def test_a_new_runtime_on_the_same_state_dir_finds_inspects_and_deletes_the_container(runtime, tmp_path):
    pids = tmp_path / "pids"
    # The command starts a child of its own: delete must end the whole session, not just the first process.
    created = await runtime.create(
        shell("shared", "sleep 300 & " + publish(pids, "echo $$ $!") + "; wait"), labels=labels("cmd-3")
    )
    shell_pid, child_pid = map(int, (await wait_until(lambda: file_text(pids), "the pids")).split())

    restarted = ProcessRuntime(tmp_path / "state")
    assert [c.id for c in await restarted.find(LABEL_COMMAND_ID, "cmd-3")] == [created.id]
    assert await restarted.find(LABEL_COMMAND_ID, "cmd-other") == []
    assert (await restarted.inspect("shared")).state == "running"
    assert [c.name for c in await restarted.list()] == ["shared"]

    deleted = await restarted.delete("shared", timeout_s=5)
    assert deleted.id == created.id and deleted.state == "removed"
    assert deleted.exit_code == 143  # ended by SIGTERM; known to a runtime that is not its parent, from the shim's file
    assert not alive(shell_pid) and not alive(child_pid)
    assert await restarted.inspect("shared") is None and await runtime.inspect("shared") is None
    assert await restarted.delete("shared") is None


async def test_a_session_that_ignores_sigterm_is_killed_after_the_timeout(runtime, tmp_path):
    ready = tmp_path / "ready"
    await runtime.create(
        shell("stubborn", "trap '' TERM; sleep 300 & " + publish(ready, "echo $!") + "; wait"), labels=labels("cmd-4")
    )
    child = int(await wait_until(lambda: file_text(ready), "the command to start"))
    started = time.monotonic()
    deleted = await runtime.delete("stubborn", timeout_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert deleted.exit_code == 137  # SIGKILL, reported as a shell (and Docker) would
    assert not alive(child)


async def test_an_exited_process_is_reaped_and_reports_its_exit_code(runtime, tmp_path):
    await runtime.create(shell("quitter", "exit 3"), labels=labels("cmd-5"))
    info = await wait_until(lambda: exited(runtime, "quitter"), "the process to exit")
    assert info.exit_code == 3
    pid = record(tmp_path, "quitter")["pid"]
    await wait_until(lambda: asyncio.sleep(0, not Path(f"/proc/{pid}").exists()), "the runtime to reap its child")
    # A runtime that is not the parent learns the code from the file the shim wrote.
    assert (await ProcessRuntime(tmp_path / "state").inspect("quitter")).exit_code == 3


async def exited(runtime, name):
    info = await runtime.inspect(name)
    return info if info.state == "exited" else None


async def test_creating_twice_under_one_command_id_returns_the_same_container(runtime, tmp_path):
    runs = tmp_path / "runs"
    job = shell("twice", f"echo run >> {runs}; sleep 300")  # appends: a second run would show
    first = await runtime.create(job, labels=labels("cmd-6"))
    again = await ProcessRuntime(tmp_path / "state").create(job, labels=labels("cmd-6"))
    assert again.id == first.id and again.state == "running"
    await wait_until(lambda: file_text(runs), "the command to run")
    await asyncio.sleep(0.2)
    assert runs.read_text() == "run\n"


async def test_a_name_taken_by_another_command_is_refused(runtime):
    await runtime.create(shell("taken", "sleep 300"), labels=labels("cmd-7"))
    with pytest.raises(RuntimeFailure, match="'taken' already exists.*command cmd-7"):
        await runtime.create(shell("taken", "sleep 300"), labels=labels("cmd-8"))


async def test_containers_outlive_an_agent_killed_with_sigkill(tmp_path):
    state = tmp_path / "state"
    agent = textwrap.dedent(f"""
        import asyncio, sys, time
        from agent.runtime.process import ProcessRuntime
        from common.containers import ContainerSpec
        spec = ContainerSpec(name="survivor", image="none", command=["sleep", "300"])
        asyncio.run(ProcessRuntime({str(state)!r}).create(spec, labels={{"io.idlegrid.command-id": "cmd-9"}}))
        print("created", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", agent], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "created\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    restarted = ProcessRuntime(state)
    [found] = await restarted.find(LABEL_COMMAND_ID, "cmd-9")
    assert found.state == "running"
    pid = record(tmp_path, "survivor")["pid"]
    deleted = await restarted.delete("survivor", timeout_s=5)
    assert deleted.state == "removed"
    assert not alive(pid)
    assert await restarted.list() == []


async def test_a_command_never_runs_when_its_record_could_not_be_written(tmp_path, monkeypatch):
    witness = tmp_path / "ran"

    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(process_module, "write_atomically", disk_full)
    with pytest.raises(OSError, match="No space left"):
        await ProcessRuntime(tmp_path / "state").create(shell("unrecorded", f"touch {witness}"), labels=labels("cmd-10"))
    await asyncio.sleep(0.3)
    assert not witness.exists()


async def test_a_spec_without_a_command_or_with_an_unknown_program_fails_clearly(runtime):
    with pytest.raises(RuntimeFailure, match="has no command; the process runtime"):
        await runtime.create(ContainerSpec(name="empty", image="busybox"), labels=labels("cmd-11"))
    with pytest.raises(RuntimeFailure, match="'no-such-program' .* is not an executable on this host"):
        await runtime.create(ContainerSpec(name="typo", image="x", command=["no-such-program"]), labels=labels("cmd-12"))
    assert await runtime.list() == []


def test_the_process_runtime_needs_a_state_dir(tmp_path):
    assert open_runtime("process", state_dir=tmp_path).name == "process"
    with pytest.raises(ConfigError, match="bad options for the process runtime"):
        open_runtime("process")
