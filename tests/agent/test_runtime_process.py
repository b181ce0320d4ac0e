"""The process runtime: real subprocesses as an unprivileged user in their own PID namespace, records that outlive
the agent, every process of a container killed on delete. These tests run as root (the agent's production case), so
the commands run as ``nobody``; they write what they saw into their own working directory."""

import asyncio
import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import agent.runtime.process as process_module
from agent.identity import KEY_FILE
from agent.runtime import open_runtime
from agent.runtime.base import STDERR, STDOUT
from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.errors import BadCommand, ConfigError, RuntimeFailure
from common.pki import write_private_key

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


def load_record(runtime, name):
    return runtime._load(name)


async def test_a_container_is_a_process_with_its_gpus_env_and_memory_limit(runtime, tmp_path):
    out = runtime.workdir("job") / "seen"
    script = publish("seen", "env; cat /proc/self/limits") + "; sleep 300"
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
    out = runtime.workdir("cpu-job") / "seen"
    script = publish("seen", "env; grep Cpus_allowed_list /proc/self/status") + "; sleep 300"
    await runtime.create(shell("cpu-job", script, cpus=0.5), labels=labels("cmd-2"))
    seen = (await wait_until(lambda: file_text(out), "the command's env")).splitlines()
    assert "CUDA_VISIBLE_DEVICES=" in seen
    allowed = seen[-1].split()[-1]
    assert allowed.isdigit() and int(allowed) in os.sched_getaffinity(0)  # half a CPU is one whole core


async def test_a_new_runtime_on_the_same_state_dir_finds_inspects_and_deletes_the_container(runtime, tmp_path):
    pids = runtime.workdir("shared") / "pids"
    # The command starts a child of its own: delete must end the whole container, not just the first process.
    created = await runtime.create(
        shell("shared", "sleep 300 & " + publish("pids", "echo $$ $!") + "; wait"), labels=labels("cmd-3")
    )
    await wait_until(lambda: file_text(pids), "the pids")
    members = process_module.namespace_members(load_record(runtime, "shared"))
    assert len(members) == 3  # the shim, the command's shell and its sleep

    restarted = ProcessRuntime(tmp_path / "state")
    assert [c.id for c in await restarted.find(LABEL_COMMAND_ID, "cmd-3")] == [created.id]
    assert await restarted.find(LABEL_COMMAND_ID, "cmd-other") == []
    shared = await restarted.inspect("shared")
    assert shared is not None and shared.state == "running"
    assert [c.name for c in await restarted.list()] == ["shared"]

    deleted = await restarted.delete("shared", timeout_s=5)
    assert deleted is not None and deleted.id == created.id and deleted.state == "removed"
    assert deleted.exit_code == 143  # ended by SIGTERM; known to a runtime that is not its parent, from the shim's file
    assert not any(map(alive, members))
    assert await restarted.inspect("shared") is None and await runtime.inspect("shared") is None
    assert await restarted.delete("shared") is None


async def test_a_session_that_ignores_sigterm_is_killed_after_the_timeout(runtime, tmp_path):
    ready = runtime.workdir("stubborn") / "ready"
    await runtime.create(
        shell("stubborn", "trap '' TERM; sleep 300 & " + publish("ready", "echo $!") + "; wait"), labels=labels("cmd-4")
    )
    await wait_until(lambda: file_text(ready), "the command to start")
    members = process_module.namespace_members(load_record(runtime, "stubborn"))
    started = time.monotonic()
    deleted = await runtime.delete("stubborn", timeout_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert deleted.exit_code == 137  # SIGKILL, reported as a shell (and Docker) would
    assert members and not any(map(alive, members))


async def test_an_exited_process_is_reaped_and_reports_its_exit_code(runtime, tmp_path):
    await runtime.create(shell("quitter", "exit 3"), labels=labels("cmd-5"))
    info = await wait_until(lambda: exited(runtime, "quitter"), "the process to exit")
    assert info.exit_code == 3
    pid = record(tmp_path, "quitter")["pid"]
    await wait_until(lambda: asyncio.sleep(0, not Path(f"/proc/{pid}").exists()), "the runtime to reap its child")
    # A runtime that is not the parent learns the code from the file the shim wrote.
    quitter = await ProcessRuntime(tmp_path / "state").inspect("quitter")
    assert quitter is not None and quitter.exit_code == 3


async def exited(runtime, name):
    info = await runtime.inspect(name)
    return info if info.state == "exited" else None


async def test_creating_twice_under_one_command_id_returns_the_same_container(runtime, tmp_path):
    runs = runtime.workdir("twice") / "runs"
    job = shell("twice", "echo run >> runs; sleep 300")  # appends: a second run would show
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
        assert proc.stdout is not None and proc.stdout.readline() == "created\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    restarted = ProcessRuntime(state)
    [found] = await restarted.find(LABEL_COMMAND_ID, "cmd-9")
    assert found.state == "running"
    pid = record(tmp_path, "survivor")["pid"]
    deleted = await restarted.delete("survivor", timeout_s=5)
    assert deleted is not None and deleted.state == "removed"
    assert not alive(pid)
    assert await restarted.list() == []


async def test_a_command_never_runs_when_its_record_could_not_be_written(tmp_path, monkeypatch):
    runtime = ProcessRuntime(tmp_path / "state")
    witness = runtime.workdir("unrecorded") / "ran"

    def disk_full(path, data, **options):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(process_module, "write_atomically", disk_full)
    with pytest.raises(OSError, match="No space left"):
        await runtime.create(shell("unrecorded", "touch ran"), labels=labels("cmd-10"))
    await asyncio.sleep(0.3)
    assert not witness.exists()


async def test_a_spec_without_a_command_or_with_an_unknown_program_fails_clearly_as_the_renters_command(runtime):
    with pytest.raises(BadCommand, match="has no command; the process runtime"):
        await runtime.create(ContainerSpec(name="empty", image="busybox"), labels=labels("cmd-11"))
    with pytest.raises(BadCommand, match="'no-such-program' .* is not an executable on this host"):
        await runtime.create(ContainerSpec(name="typo", image="x", command=["no-such-program"]), labels=labels("cmd-12"))
    assert await runtime.list() == []


def test_the_process_runtime_needs_a_state_dir(tmp_path):
    assert open_runtime("process", state_dir=tmp_path).name == "process"
    with pytest.raises(ConfigError, match="bad options for the process runtime"):
        open_runtime("process")


def test_a_uid_range_that_holds_a_users_uid_or_is_no_range_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: an agent that is not root gives containers no uids of their own")
    nobody = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(ConfigError, match=f"holds uid {nobody} of user 'nobody'"):
        ProcessRuntime(tmp_path / "state", uids=f"{nobody - 5}-{nobody + 5}")
    for bad in ("lots", "5-2", "70000-99999999999"):
        with pytest.raises(ConfigError, match="process_uids"):
            ProcessRuntime(tmp_path / "state", uids=bad)
    with pytest.raises(ConfigError, match="process_network 'bridge'"):
        ProcessRuntime(tmp_path / "state", network="bridge")


async def test_an_old_setting_naming_one_user_still_gives_each_container_a_uid_of_its_own(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: an agent that is not root gives containers no uids of their own")
    runtime = ProcessRuntime(tmp_path / "state", user="nobody")
    try:
        for name in ("first", "second"):
            await runtime.create(shell(name, "sleep 300"), labels=labels(f"cmd-{name}"))
        uids = {load_record(runtime, name).uid for name in ("first", "second")}
    finally:
        for name in ("first", "second"):
            await runtime.delete(name, timeout_s=0)
    assert uids == {1_000_000, 1_000_001}


async def test_exec_into_a_container_an_older_agent_started_without_a_uid_is_refused(runtime, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: an agent that is not root gives containers no uids of their own")
    await runtime.create(shell("legacy", "sleep 300"), labels=labels("cmd-old"))
    path = tmp_path / "state" / "containers" / "legacy.json"
    old = json.loads(path.read_text())
    del old["uid"]  # as an agent before uids per container wrote it
    path.write_text(json.dumps(old))
    with pytest.raises(RuntimeFailure, match="older agent without a uid of its own"):
        await runtime.exec("legacy", ["id"], tty=False)


def host_processes_running(marker):
    """Pids of every process on the host whose command line holds ``marker``, whatever namespace it is in."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


async def test_a_container_that_calls_setsid_and_double_forks_leaves_nothing_behind_after_delete(runtime):
    # Two escapes from the container's session: a setsid'd sleeper, and a double fork whose grandchild is orphaned.
    script = "setsid sleep 3001 & sh -c 'sleep 3002 & exit 0'; " + publish("ready", "echo started") + "; sleep 3003"
    await runtime.create(shell("escaper", script), labels=labels("cmd-13"))
    await wait_until(lambda: file_text(runtime.workdir("escaper") / "ready"), "the command to start")
    for marker in ("sleep 3001", "sleep 3002", "sleep 3003"):
        await wait_until(lambda m=marker: asyncio.sleep(0, host_processes_running(m)), f"{marker} to run")

    deleted = await runtime.delete("escaper", timeout_s=1)

    assert deleted.state == "removed"
    for marker in ("sleep 3001", "sleep 3002", "sleep 3003"):
        assert host_processes_running(marker) == [], f"{marker} outlived delete_container"


async def test_a_container_runs_as_an_unprivileged_user_and_cannot_read_the_agents_key(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: an agent that is not root cannot switch users (and reports isolation 'none')")
    state = tmp_path / "state"
    runtime = ProcessRuntime(state)  # makes the state directory, as the agent does, private
    write_private_key(state / KEY_FILE, b"-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")
    key = state / KEY_FILE
    script = publish("seen", f"id -u; id -G; cat {key} || echo refused; ls {state} || echo refused") + "; sleep 300"
    await runtime.create(shell("thief", script), labels=labels("cmd-14"))
    try:
        seen = (await wait_until(lambda: file_text(runtime.workdir("thief") / "seen"), "the command to run")).splitlines()
        uid = record(tmp_path, "thief")["uid"]
    finally:
        await runtime.delete("thief", timeout_s=0)

    assert 1_000_000 <= uid <= 1_065_535  # its own, from the reserved range
    assert seen[0] == str(uid) and seen[1] == str(uid)  # no root, no supplementary groups
    assert "secret" not in seen and seen[2:] == ["refused", "refused"]
    assert runtime.isolation == "sandbox"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(runtime.workdir("thief").parent.stat().st_mode) & 0o022 == 0  # nobody may not plant files


async def test_the_records_and_logs_of_containers_are_private_to_the_agent(runtime, tmp_path):
    await runtime.create(shell("quiet", "echo hello; sleep 300"), labels=labels("cmd-15"))
    containers = tmp_path / "state" / "containers"
    assert stat.S_IMODE(containers.stat().st_mode) == 0o700
    for suffix in (".json", ".log", ".exit"):
        assert stat.S_IMODE((containers / f"quiet{suffix}").stat().st_mode) == 0o600, suffix


# --- renter access: logs, exec, connect ------------------------------------------------------------------


async def whole_log(runtime, name):
    return b"".join([data async for _, data in runtime.logs(name, tail=-1, follow=False)])


async def until_logged(runtime, name, text):
    async def logged():
        return text in await whole_log(runtime, name)

    await wait_until(logged, f"{text!r} in the log of {name!r}")


async def output_of(session, timeout_s=10.0):
    """Everything the command wrote, by channel, once it has ended."""
    seen = {STDOUT: b"", STDERR: b""}

    async def drain():
        while (chunk := await session.read()) is not None:
            seen[chunk[0]] += chunk[1]

    await asyncio.wait_for(drain(), timeout_s)
    return seen


async def test_logs_give_the_last_lines_of_the_containers_output_or_all_of_it(runtime):
    await runtime.create(
        shell("chatty", "printf 'one\\ntwo\\n'; echo three >&2; printf 'unfinished'; sleep 300"), labels=labels("cmd-l1")
    )
    await until_logged(runtime, "chatty", b"unfinished")

    async def tail(lines):
        chunks = [chunk async for chunk in runtime.logs("chatty", tail=lines, follow=False)]
        assert {channel for channel, _ in chunks} <= {STDOUT}  # output and errors share one file, as a terminal would
        return b"".join(data for _, data in chunks)

    assert await tail(-1) == b"one\ntwo\nthree\nunfinished"
    assert await tail(2) == b"three\nunfinished"  # a last line without its newline is a line
    assert await tail(4) == await tail(10) == b"one\ntwo\nthree\nunfinished"
    assert await tail(0) == b""


async def test_following_logs_yields_what_is_written_later_and_ends_with_the_container(runtime):
    script = "echo ready; while [ ! -e go ]; do sleep 0.05; done; echo later >&2; exit 0"
    await runtime.create(shell("follower", script), labels=labels("cmd-l2"))
    stream = runtime.logs("follower", tail=-1, follow=True)
    assert await asyncio.wait_for(anext(stream), 10) == (STDOUT, b"ready\n")

    (runtime.workdir("follower") / "go").touch()  # only now does the container write again
    assert await asyncio.wait_for(anext(stream), 10) == (STDOUT, b"later\n")
    with pytest.raises(StopAsyncIteration):  # the container exited, so following ends
        await asyncio.wait_for(anext(stream), 10)


async def test_logs_of_a_container_that_is_not_here_fail_saying_so(runtime):
    with pytest.raises(RuntimeFailure, match="no container named 'ghost' on this host"):
        [chunk async for chunk in runtime.logs("ghost", tail=10, follow=False)]


async def test_exec_without_a_tty_runs_as_the_container_in_its_directory_with_its_environment(runtime):
    await runtime.create(shell("worker", "sleep 300", env={"MODE": "train"}), labels=labels("cmd-e1"))
    script = "cat; echo oops >&2; id -u; pwd; echo $MODE; exit 3"
    session = await runtime.exec("worker", ["sh", "-c", script], tty=False)
    await session.write(b"hello ")
    await session.write(b"renter\n")
    await session.close_stdin()  # cat sees end of input, and the script goes on
    output = await output_of(session)
    uid = load_record(runtime, "worker").uid if os.geteuid() == 0 else os.geteuid()
    seen_at = "/idlegrid/work" if os.geteuid() == 0 else runtime.workdir("worker")  # as root: a fixed path, bound
    assert output == {STDOUT: f"hello renter\n{uid}\n{seen_at}\ntrain\n".encode(), STDERR: b"oops\n"}
    assert await asyncio.wait_for(session.wait(), 10) == 3
    await session.close()


async def test_exec_with_a_tty_gets_the_asked_size_and_reports_the_status(runtime):
    await runtime.create(shell("terminal", "sleep 300"), labels=labels("cmd-e2"))
    session = await runtime.exec("terminal", ["sh", "-c", "stty size; tty; exit 3"], tty=True, cols=100, rows=30)
    lines = (await output_of(session))[STDOUT].splitlines()
    assert lines[0] == b"30 100" and lines[1].startswith(b"/dev/pts/")  # a real terminal, one output channel
    assert await asyncio.wait_for(session.wait(), 10) == 3
    await session.close()


async def test_a_terminal_without_a_size_is_80_by_24(runtime):
    await runtime.create(shell("unsized", "sleep 300"), labels=labels("cmd-e11"))
    session = await runtime.exec("unsized", ["stty", "size"], tty=True, cols=0, rows=0)  # a ticket that gave none
    assert (await output_of(session))[STDOUT] == b"24 80\r\n"
    await session.close()


async def test_resizing_an_exec_terminal_changes_what_the_command_sees(runtime):
    await runtime.create(shell("resizer", "sleep 300"), labels=labels("cmd-e3"))
    session = await runtime.exec("resizer", ["sh", "-c", "read line; stty size"], tty=True)
    await session.resize(132, 50)
    await session.write(b"go\r")
    assert b"50 132" in (await output_of(session))[STDOUT]
    assert await asyncio.wait_for(session.wait(), 10) == 0
    await session.close()


async def test_end_of_input_on_a_terminal_reaches_the_command(runtime):
    await runtime.create(shell("typist", "sleep 300"), labels=labels("cmd-e4"))
    session = await runtime.exec("typist", ["sh", "-c", "cat > typed; echo saw-eof; cat typed"], tty=True)
    await session.write(b"abc\r")
    await session.close_stdin()
    assert (await output_of(session))[STDOUT].endswith(b"saw-eof\r\nabc\r\n")
    assert await asyncio.wait_for(session.wait(), 10) == 0
    await session.close()


async def test_closing_an_exec_session_stops_the_command_and_everything_it_started(runtime):
    await runtime.create(shell("host-of-sleeper", "sleep 300"), labels=labels("cmd-e5"))
    session = await runtime.exec("host-of-sleeper", ["sh", "-c", "sleep 3005 & sleep 3006"], tty=False)
    for marker in ("sleep 3005", "sleep 3006"):
        await wait_until(lambda m=marker: asyncio.sleep(0, host_processes_running(m)), f"{marker} to run")
    await session.close()  # the renter went away
    assert await asyncio.wait_for(session.wait(), 10) == 137
    for marker in ("sleep 3005", "sleep 3006"):
        await wait_until(lambda m=marker: asyncio.sleep(0, not host_processes_running(m)), f"{marker} to end")
    assert (await runtime.inspect("host-of-sleeper")).state == "running"


async def test_an_exec_runs_inside_the_container_so_deleting_the_container_ends_it(runtime):
    await runtime.create(shell("doomed", "sleep 300"), labels=labels("cmd-e6"))
    session = await runtime.exec("doomed", ["sleep", "3007"], tty=True)
    await wait_until(lambda: asyncio.sleep(0, running_exactly(b"sleep\x003007\x00")), "the exec to run")
    [pid] = running_exactly(b"sleep\x003007\x00")  # not the launchers above it, whose command lines end with it
    container = load_record(runtime, "doomed")
    assert os.readlink(f"/proc/{pid}/ns/pid") == container.pid_namespace
    await runtime.delete("doomed", timeout_s=1)
    assert await asyncio.wait_for(session.wait(), 10) in (143, 137)  # SIGTERM from delete, or SIGKILL after
    assert host_processes_running("sleep 3007") == []
    await session.close()


async def test_exec_and_connect_refuse_a_stopped_or_absent_container(runtime):
    await runtime.create(shell("finished", "exit 0"), labels=labels("cmd-e7"))
    await wait_until(lambda: exited(runtime, "finished"), "the container to exit")
    with pytest.raises(RuntimeFailure, match=r"container 'finished' is not running \(it is exited, exit code 0\)"):
        await runtime.exec("finished", ["sh"], tty=True)
    with pytest.raises(RuntimeFailure, match="container 'finished' is not running"):
        await runtime.connect("finished", 8888)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await runtime.exec("ghost", ["sh"], tty=False)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await runtime.connect("ghost", 8888)


def running_exactly(cmdline):
    found = []
    for pid in host_processes_running("sleep"):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                found.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass  # ended between the listing and this read
    return found


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_connect_reaches_a_web_server_run_as_the_container(runtime):
    port = free_port()
    job = ContainerSpec(
        name="notebook",
        image="none",
        command=["python3", "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "."],
    )
    await runtime.create(job, labels=labels("cmd-c1"))
    # It serves its working directory, by a relative path: nobody may not search the test's own temporary directory.
    (runtime.workdir("notebook") / "hello.txt").write_text("hello from the container\n")
    await until_logged(runtime, "notebook", b"Serving HTTP")

    reader, writer = await runtime.connect("notebook", port)
    writer.write(b"GET /hello.txt HTTP/1.0\r\nHost: container\r\n\r\n")
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert b" 200 " in response.split(b"\r\n")[0]
    assert response.endswith(b"\r\n\r\nhello from the container\n")


async def test_connect_to_a_port_nothing_listens_on_fails_saying_so(runtime):
    await runtime.create(shell("silent", "sleep 300"), labels=labels("cmd-c2"))
    port = free_port()
    with pytest.raises(RuntimeFailure, match=f"nothing listens on port {port} of container 'silent'"):
        await runtime.connect("silent", port)


async def test_exec_of_a_program_the_host_lacks_exits_127_saying_so(runtime):
    await runtime.create(shell("bare", "sleep 300"), labels=labels("cmd-e8"))
    session = await runtime.exec("bare", ["no-such-program"], tty=False)
    output = await output_of(session)
    assert b"no-such-program: No such file or directory" in output[STDERR]
    assert await asyncio.wait_for(session.wait(), 10) == 127  # as the Docker runtime and a shell report it
    await session.close()


async def test_a_terminal_gets_term_unless_the_container_sets_its_own(runtime):
    await runtime.create(shell("styled", "sleep 300", env={"TERM": "vt100"}), labels=labels("cmd-e9"))
    await runtime.create(shell("plain", "sleep 300"), labels=labels("cmd-e10"))
    for name, term in (("styled", b"vt100"), ("plain", b"xterm")):
        session = await runtime.exec(name, ["sh", "-c", "echo $TERM"], tty=True)
        assert (await output_of(session))[STDOUT] == term + b"\r\n"
        await session.close()
