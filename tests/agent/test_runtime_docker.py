"""The Docker-API runtime, against the real Podman Docker-compatible service."""

import asyncio
import socket
import time

import pytest

from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.runtime import open_runtime
from agent.runtime.base import STDERR, STDOUT, container_labels
from agent.runtime.docker import DEFAULT_CAPABILITIES, DockerRuntime, libpod_create_body
from agent.runtime.gpu_access import KFD, DeviceNode, GpuAccess, GpuDevices
from agent.runtime.selftest import gpu_selftest
from common.containers import (
    LABEL_AGENT_ID,
    LABEL_COMMAND_ID,
    LABEL_NAME,
    LABEL_RENTAL_ID,
    LABEL_REPLICA,
    LABEL_WORKLOAD_ID,
    ContainerSpec,
)
from common.errors import ConfigError, RuntimeFailure
from common.inventory import GpuInfo
from common.pki import CommandSigner, CommandVerifier
from common.wire import Command, CommandBody, signing_bytes
from tests.support.grid import wait_for

pytestmark = pytest.mark.podman
MIB = 1024 * 1024


@pytest.fixture
async def runtime(podman):
    rt = DockerRuntime(podman.socket_path)
    yield rt
    await rt.close()
    podman.podman("rm", "--all", "--force", "--time", "0")  # whatever a failed test left running


def spec(podman, name, **fields):
    return ContainerSpec(name=name, image=podman.image, **{"command": ["sleep", "300"], **fields})


def agent_labels(command_id, **extra):
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1", **extra}


async def test_a_container_runs_with_the_specs_limits_hardening_and_labels(runtime, podman):
    job = spec(podman, "limits", cpus=0.5, memory_mib=64, env={"MODE": "train"}, labels={"team": "vision"})
    info = await runtime.create(job, labels=agent_labels("cmd-1", **{LABEL_RENTAL_ID: "rent-7"}))

    assert info.state == "running" and info.name == "limits" and info.runtime == "docker"
    raw = podman.inspect("limits")
    host = raw["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 64 * MIB
    assert host["Privileged"] is False
    assert "no-new-privileges" in host["SecurityOpt"]
    assert "NET_RAW" in host["CapDrop"] and "MKNOD" in host["CapDrop"]
    assert raw["Config"]["Labels"] == {
        "team": "vision",
        LABEL_COMMAND_ID: "cmd-1",
        LABEL_AGENT_ID: "agt-1",
        LABEL_RENTAL_ID: "rent-7",
        LABEL_NAME: "limits",
    }
    assert "MODE=train" in raw["Config"]["Env"]
    assert raw["State"]["Running"] is True
    assert raw["Config"]["Cmd"] == ["sleep", "300"]


def test_a_renter_cannot_set_the_agents_own_labels(podman):
    with pytest.raises(ValueError, match="reserved"):
        spec(podman, "spoof", labels={LABEL_RENTAL_ID: "someone-elses", "team": "x"})


async def test_creating_twice_under_one_command_id_returns_the_same_container(runtime, podman):
    first = await runtime.create(spec(podman, "twice"), labels=agent_labels("cmd-2"))
    again = await runtime.create(spec(podman, "twice"), labels=agent_labels("cmd-2"))
    assert again.id == first.id and again.state == "running"
    _, listed = podman.api("GET", '/containers/json?all=true&filters={"name":["twice"]}')
    assert len(listed) == 1


async def test_a_name_taken_by_another_command_is_refused(runtime, podman):
    await runtime.create(spec(podman, "taken"), labels=agent_labels("cmd-3"))
    with pytest.raises(RuntimeFailure, match="'taken' already exists.*command cmd-3"):
        await runtime.create(spec(podman, "taken"), labels=agent_labels("cmd-4"))


async def test_a_restarted_agent_finds_its_containers_by_command_id_and_lists_only_its_own(runtime, podman):
    await runtime.create(spec(podman, "findme"), labels=agent_labels("cmd-5"))
    podman.podman("create", "--name", "not-ours", podman.image)  # the provider's own container: no idlegrid labels

    restarted = DockerRuntime(podman.socket_path)
    try:
        found = await restarted.find(LABEL_COMMAND_ID, "cmd-5")
        assert [c.name for c in found] == ["findme"]
        assert found[0].state == "running"
        assert await restarted.find(LABEL_COMMAND_ID, "cmd-never") == []
        assert [c.name for c in await restarted.list()] == ["findme"]
    finally:
        await restarted.close()


async def test_delete_stops_and_removes_the_container(runtime, podman):
    created = await runtime.create(spec(podman, "doomed"), labels=agent_labels("cmd-6"))
    deleted = await runtime.delete("doomed", timeout_s=1)
    assert deleted.id == created.id
    assert deleted.state == "removed"
    assert deleted.exit_code == 137  # sleep as PID 1 ignores SIGTERM, so the engine killed it after the timeout
    assert podman.inspect("doomed") is None
    assert await runtime.inspect("doomed") is None


async def test_deleting_an_unknown_name_returns_none(runtime):
    assert await runtime.delete("never-was", timeout_s=0) is None


async def test_a_finished_container_reports_its_exit_code(runtime, podman):
    await runtime.create(spec(podman, "quitter", command=["sh", "-c", "exit 3"]), labels=agent_labels("cmd-7"))
    info = await runtime.inspect("quitter")
    for _ in range(100):
        if info.state == "exited":
            break
        await asyncio.sleep(0.05)
        info = await runtime.inspect("quitter")
    assert (info.state, info.exit_code) == ("exited", 3)
    assert [(c.state, c.exit_code) for c in await runtime.find(LABEL_COMMAND_ID, "cmd-7")] == [("exited", 3)]


async def test_a_missing_image_fails_clearly_and_nothing_is_pulled(runtime, podman):
    job = ContainerSpec(name="noimage", image="example.invalid/nothing:1", command=["true"])
    with pytest.raises(
        RuntimeFailure, match="image not found: .example.invalid/nothing:1. is not on this host, which does not pull images"
    ):
        await runtime.create(job, labels=agent_labels("cmd-8"))
    assert podman.inspect("noimage") is None


async def test_a_command_that_cannot_start_fails_and_frees_its_name(runtime, podman):
    with pytest.raises(RuntimeFailure, match="starting container 'broken' failed"):
        await runtime.create(spec(podman, "broken", command=["/no/such/program"]), labels=agent_labels("cmd-9"))
    assert podman.inspect("broken") is None


async def test_gpus_the_engine_does_not_grant_are_refused_and_the_container_removed(podman):
    # Podman's Docker API silently ignores DeviceRequests, as a Docker without the NVIDIA toolkit does: asked for them
    # (as on Docker), no GPU is needed to see that the runtime notices.
    rt = DockerRuntime(podman.socket_path, gpu_devices="device_requests")
    try:
        job = spec(podman, "gpu-job", gpus=["GPU-6f2c7a1e-0000-0000-0000-000000000000"])
        with pytest.raises(RuntimeFailure, match="dropped the request for GPUs GPU-6f2c7a1e"):
            await rt.create(job, labels=agent_labels("cmd-10"))
        assert podman.inspect("gpu-job") is None
    finally:
        await rt.close()


async def test_on_podman_gpus_are_asked_as_cdi_devices_through_its_own_api(runtime, podman):
    # No GPU and no NVIDIA CDI specification here: Podman itself refuses the CDI device it was asked for, by name,
    # when it starts the container (the old way, DeviceRequests, it would have dropped without a word).
    job = spec(podman, "cdi-job", gpus=["GPU-6f2c7a1e-0000-0000-0000-000000000001"])
    with pytest.raises(RuntimeFailure, match="nvidia.com/gpu=GPU-6f2c7a1e-0000-0000-0000-000000000001"):
        await runtime.create(job, labels=agent_labels("cmd-10b"))
    assert runtime.engine == "podman" and runtime.gpu_mode() == "cdi"
    assert podman.inspect("cdi-job") is None  # not left behind, blocking its name


async def test_podmans_own_create_body_keeps_the_limits_and_hardening(runtime, podman):
    # The body the runtime sends Podman's API for a GPU container, without the GPU (none here), checked by Podman.
    job = spec(podman, "libpod-job", cpus=0.5, memory_mib=64, env={"MODE": "train"}, labels={"team": "vision"})
    body = libpod_create_body(job, container_labels(job, agent_labels("cmd-10c")), DEFAULT_CAPABILITIES)
    status, reply = podman.api("POST", "/libpod/containers/create", body)  # Podman's own API, under any version
    assert status == 201, reply
    raw = podman.inspect("libpod-job")
    host = raw["HostConfig"]
    assert host["NanoCpus"] == 500_000_000 and host["Memory"] == 64 * MIB
    assert "no-new-privileges" in host["SecurityOpt"] and host["Privileged"] is False
    assert "NET_RAW" in host["CapDrop"] and "MKNOD" in host["CapDrop"]
    assert raw["Config"]["Labels"]["team"] == "vision" and "MODE=train" in raw["Config"]["Env"]


# --- the GPU self-test (agent/runtime/selftest.py) --------------------------------------------------------------------


def gpu_infos(*uuids):
    return [
        GpuInfo(
            index=i, uuid=uuid, name="NVIDIA A10", pci_bus_id=f"0000:0{i}:00.0", memory_total_mib=24576, compute_capability="8.6"
        )
        for i, uuid in enumerate(uuids)
    ]


async def test_the_self_test_sees_each_simulated_gpu_in_a_container_of_its_own(podman):
    # Simulated GPUs (no GPU here) reach a container by name: the probe prints CUDA_VISIBLE_DEVICES inside it.
    rt = DockerRuntime(podman.socket_path, simulated_gpus=True, selftest_image=podman.image)
    try:
        reach = await gpu_selftest(rt, gpu_infos("GPU-sim-aaaa", "GPU-sim-bbbb"))
        assert [(r.uuid, r.reachable) for r in reach] == [("GPU-sim-aaaa", True), ("GPU-sim-bbbb", True)]
        assert await rt.list() == [] and podman.inspect("idlegrid-selftest-0") is None  # it leaves nothing behind
    finally:
        await rt.close()


async def test_gpus_the_engine_refuses_fail_the_self_test_with_the_fix(podman):
    # The runtime asks the engine for devices (as for real GPUs) and the engine drops the request: each GPU is found
    # unreachable, with what was seen and what the provider does about it.
    rt = DockerRuntime(podman.socket_path, simulated_gpus=True, gpu_devices="device_requests", selftest_image=podman.image)
    try:
        (reach,) = await gpu_selftest(rt, gpu_infos("GPU-sim-cccc"))
        assert reach.uuid == "GPU-sim-cccc" and not reach.reachable
        assert "dropped the request for GPUs GPU-sim-cccc" in reach.detail
        assert "NVIDIA Container Toolkit" in reach.fix and "nvidia-ctk runtime configure" in reach.fix
    finally:
        await rt.close()


async def test_on_podman_without_a_cdi_specification_the_self_test_names_it(runtime, podman):
    rt = DockerRuntime(podman.socket_path, selftest_image=podman.image)
    try:
        (reach,) = await gpu_selftest(rt, gpu_infos("GPU-real-dddd"))
        assert not reach.reachable and "nvidia.com/gpu=GPU-real-dddd" in reach.detail
        assert "nvidia-ctk cdi generate" in reach.fix
    finally:
        await rt.close()


async def test_a_self_test_image_the_host_lacks_fails_saying_which(podman):
    rt = DockerRuntime(podman.socket_path, simulated_gpus=True, selftest_image="localhost/no-such-image:1")
    try:
        (reach,) = await gpu_selftest(rt, gpu_infos("GPU-sim-eeee"))
        assert not reach.reachable and "'localhost/no-such-image:1' is not on this host" in reach.detail
        assert reach.fix.startswith("podman pull localhost/no-such-image:1")
    finally:
        await rt.close()


async def test_with_simulated_gpus_a_container_is_given_them_by_name_and_no_device_is_asked(podman):
    # A simulated host (``--simulate``) has no device to give: the container runs, told which GPUs are its own.
    rt = DockerRuntime(podman.socket_path, simulated_gpus=True)
    try:
        job = spec(podman, "sim-gpu-job", gpus=["GPU-aaaa", "GPU-bbbb"])
        info = await rt.create(job, labels=agent_labels("cmd-11"))
        assert info.state == "running"
        inspected = podman.inspect("sim-gpu-job")
        assert inspected is not None and not inspected["HostConfig"].get("DeviceRequests")
        assert "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in inspected["Config"]["Env"]
    finally:
        await rt.close()
        podman.podman("rm", "--all", "--force", "--time", "0")


async def test_an_unreachable_socket_fails_clearly(tmp_path):
    rt = open_runtime("docker", socket=str(tmp_path / "missing.sock"))
    try:
        with pytest.raises(RuntimeFailure, match=rf"cannot reach the Docker API at unix://{tmp_path}/missing.sock: No such file"):
            await rt.inspect("anything")
    finally:
        await rt.close()


def test_an_unknown_runtime_kind_or_option_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown container runtime 'lxc'"):
        open_runtime("lxc")
    with pytest.raises(ConfigError, match="bad options for the docker runtime"):
        open_runtime("docker", sokcet="/run/docker.sock")


async def test_a_workload_replicas_container_carries_the_workload_and_replica_labels(runtime, podman, tmp_path):
    """Set by the agent's executor from the signed spec (as it sets the rental id), read back from Podman."""
    signer = CommandSigner.generate()
    executor = CommandExecutor(
        "agt-1",
        CommandLog(tmp_path / "commands.db"),
        runtime,
        CommandVerifier({signer.key_id: signer.public_key_b64()}),
        host_gpus=list,
    )
    name = "wl-0123456789abcdef-r1-a1"
    job = {"name": name, "image": podman.image, "command": ["sleep", "300"], "workload_id": "wl-0123456789abcdef", "replica": 1}
    body = CommandBody(
        id="cmd-wl", agent_id="agt-1", kind="create_container", spec=job, issued_at=time.time(),
        deadline=time.time() + 60, key_id=signer.key_id,
    )  # fmt: skip
    result = await executor.execute(Command(body=body, signature=signer.sign(signing_bytes(body))))
    assert result.ok, result
    labels = podman.inspect(name)["Config"]["Labels"]
    assert (labels[LABEL_WORKLOAD_ID], labels[LABEL_REPLICA], labels[LABEL_COMMAND_ID]) == ("wl-0123456789abcdef", "1", "cmd-wl")
    executor.ledger.close()


def test_a_renter_cannot_set_the_workload_labels_itself(podman):
    with pytest.raises(ValueError, match="reserved"):
        spec(podman, "spoof", labels={"io.idlegrid.workload-id": "wl-someone-elses"})


# --- renter access: logs, exec, connect ------------------------------------------------------------------


async def until_logged(runtime, name, text, timeout_s=10.0):
    """Poll the container's whole log until ``text`` is in it (no sleep as a guess)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in b"".join([data async for _, data in runtime.logs(name, tail=-1, follow=False)]):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in the logs of {name!r}")


async def output_of(session, timeout_s=10.0):
    """Everything the command wrote, by channel, once it has ended."""
    seen = {STDOUT: b"", STDERR: b""}

    async def drain():
        while (chunk := await session.read()) is not None:
            seen[chunk[0]] += chunk[1]

    await asyncio.wait_for(drain(), timeout_s)
    return seen


async def test_logs_give_the_last_lines_with_stdout_and_stderr_told_apart(runtime, podman):
    script = "echo one; echo two >&2; echo three; echo done; sleep 300"
    await runtime.create(spec(podman, "chatty", command=["sh", "-c", script]), labels=agent_labels("cmd-l1"))
    await until_logged(runtime, "chatty", b"done")

    everything = [chunk async for chunk in runtime.logs("chatty", tail=-1, follow=False)]
    # The engine reads the two pipes apart, so only the order within each channel is kept.
    assert [data for channel, data in everything if channel == STDOUT] == [b"one\n", b"three\n", b"done\n"]
    assert [data for channel, data in everything if channel == STDERR] == [b"two\n"]
    assert [chunk async for chunk in runtime.logs("chatty", tail=2, follow=False)] == everything[-2:]


async def test_following_logs_yields_what_is_written_later_and_ends_with_the_container(runtime, podman):
    script = "echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo later >&2; exit 0"
    await runtime.create(spec(podman, "follower", command=["sh", "-c", script]), labels=agent_labels("cmd-l2"))
    stream = runtime.logs("follower", tail=-1, follow=True)
    assert await asyncio.wait_for(anext(stream), 10) == (STDOUT, b"ready\n")

    podman.podman("exec", "follower", "touch", "/tmp/go")  # only now does the container write again
    assert await asyncio.wait_for(anext(stream), 10) == (STDERR, b"later\n")
    with pytest.raises(StopAsyncIteration):  # the container exited, so following ends
        await asyncio.wait_for(anext(stream), 10)


async def test_logs_of_a_container_that_is_not_here_fail_saying_so(runtime):
    with pytest.raises(RuntimeFailure, match="no container named 'ghost' on this host"):
        [chunk async for chunk in runtime.logs("ghost", tail=10, follow=False)]


async def test_exec_without_a_tty_feeds_stdin_reads_stdout_and_stderr_apart_and_reports_the_status(runtime, podman):
    await runtime.create(spec(podman, "worker"), labels=agent_labels("cmd-e1"))
    session = await runtime.exec("worker", ["sh", "-c", "cat; echo oops >&2; exit 3"], tty=False)
    await session.write(b"hello ")
    await session.write(b"renter\n")
    await session.close_stdin()  # cat sees end of input, and the script goes on
    assert await output_of(session) == {STDOUT: b"hello renter\n", STDERR: b"oops\n"}
    assert await asyncio.wait_for(session.wait(), 10) == 3
    await session.close()


async def test_exec_with_a_tty_gets_the_asked_size_and_reports_the_status(runtime, podman):
    await runtime.create(spec(podman, "terminal"), labels=agent_labels("cmd-e2"))
    session = await runtime.exec("terminal", ["sh", "-c", "stty size; exit 3"], tty=True, cols=100, rows=30)
    output = await output_of(session)
    assert output[STDOUT].strip() == b"30 100" and output[STDERR] == b""  # a terminal has one output channel
    assert await asyncio.wait_for(session.wait(), 10) == 3
    await session.close()


async def test_resizing_an_exec_terminal_changes_what_the_command_sees(runtime, podman):
    await runtime.create(spec(podman, "resizer"), labels=agent_labels("cmd-e3"))
    session = await runtime.exec("resizer", ["sh", "-c", "while read line; do stty size; done"], tty=True)
    await session.resize(132, 50)  # at once: the engine's own first size (80x24) must not win over it
    seen = b""
    deadline = time.monotonic() + 5
    while b"50 132" not in seen and time.monotonic() < deadline:
        await session.write(b"size?\r")  # each line asks the terminal's size again
        chunk = await asyncio.wait_for(session.read(), 5)
        seen += chunk[1]
    assert b"50 132" in seen
    await session.close_stdin()
    await output_of(session)
    assert await asyncio.wait_for(session.wait(), 10) == 0
    await session.close()


async def test_end_of_input_on_a_terminal_reaches_the_command(runtime, podman):
    await runtime.create(spec(podman, "typist"), labels=agent_labels("cmd-e7"))
    session = await runtime.exec("typist", ["sh", "-c", "cat > /tmp/typed; echo saw-eof; cat /tmp/typed"], tty=True)
    await session.write(b"abc\r")
    await session.close_stdin()  # a terminal's EOF character: the engine cannot close a terminal's input
    assert (await output_of(session))[STDOUT].endswith(b"saw-eof\r\nabc\r\n")
    assert await asyncio.wait_for(session.wait(), 10) == 0
    await session.close()


async def test_closing_an_exec_session_stops_a_command_that_still_runs(runtime, podman):
    await runtime.create(spec(podman, "host-of-sleeper"), labels=agent_labels("cmd-e4"))
    session = await runtime.exec("host-of-sleeper", ["sleep", "3001"], tty=False)
    running = lambda: "sleep 3001" in podman.podman("top", "host-of-sleeper").stdout  # noqa: E731
    await until(running, "the command to run")
    await session.close()  # the renter went away; the engine would leave it running
    assert await asyncio.wait_for(session.wait(), 10) == 137
    assert not running()


async def test_exec_and_connect_refuse_a_stopped_or_absent_container(runtime, podman):
    await runtime.create(spec(podman, "finished", command=["true"]), labels=agent_labels("cmd-e5"))
    for _ in range(100):
        if (await runtime.inspect("finished")).state == "exited":
            break
        await asyncio.sleep(0.05)
    with pytest.raises(RuntimeFailure, match=r"container 'finished' is not running \(it is exited, exit code 0\)"):
        await runtime.exec("finished", ["sh"], tty=True)
    with pytest.raises(RuntimeFailure, match="container 'finished' is not running"):
        await runtime.connect("finished", 8888)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await runtime.exec("ghost", ["sh"], tty=False)
    with pytest.raises(RuntimeFailure, match="no container named 'ghost'"):
        await runtime.connect("ghost", 8888)


WEB_SERVER = "mkdir /www && echo hello-from-{name} > /www/index.html && httpd -p {listen} -h /www && echo serving; sleep 300"


async def http_get(reader, writer, path):
    writer.write(f"GET {path} HTTP/1.0\r\nHost: container\r\n\r\n".encode())
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_connect_reaches_a_web_server_in_the_container_on_its_network(runtime, podman):
    script = WEB_SERVER.format(name="bridged", listen="8888")
    await runtime.create(spec(podman, "bridged", command=["sh", "-c", script]), labels=agent_labels("cmd-c1"))
    await until_logged(runtime, "bridged", b"serving")
    reader, writer = await runtime.connect("bridged", 8888)
    address = podman.inspect("bridged")["NetworkSettings"]["IPAddress"]
    assert writer.get_extra_info("peername") == (address, 8888)  # straight to the container's address
    response = await http_get(reader, writer, "/index.html")
    assert response.startswith(b"HTTP/1.") and b" 200 " in response.split(b"\r\n")[0]
    assert response.endswith(b"hello-from-bridged\n")


@pytest.mark.parametrize(
    ("network", "listen"),
    [("none", "8888"), ("bridge", "127.0.0.1:8888")],
    ids=["container-without-a-network", "server-bound-to-the-containers-localhost"],
)
async def test_connect_goes_through_exec_where_the_agent_cannot_reach_the_port_directly(runtime, podman, network, listen):
    script = WEB_SERVER.format(name="inside", listen=listen)
    podman.podman("run", "-d", "--name", "inside", f"--network={network}", podman.image, "sh", "-c", script)
    await until_logged(runtime, "inside", b"serving")
    reader, writer = await runtime.connect("inside", 8888)
    assert writer.get_extra_info("socket").family == socket.AF_UNIX  # the far end is nc, run in the container
    await until(lambda: bridge_runs(podman, "inside"), "nc to run in the container")
    response = await http_get(reader, writer, "/index.html")
    assert b" 200 " in response.split(b"\r\n")[0]
    assert response.endswith(b"hello-from-inside\n")
    # The server closed the connection, so nc ends, and nothing of the bridge stays.
    await until(lambda: not bridge_runs(podman, "inside"), "nc to end")


def bridge_runs(podman, name):
    return "nc 127.0.0.1 8888" in podman.podman("top", name).stdout


async def until(condition, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_exec_of_a_program_the_image_lacks_exits_127_saying_so(runtime, podman):
    await runtime.create(spec(podman, "bare"), labels=agent_labels("cmd-e6"))
    session = await runtime.exec("bare", ["no-such-program"], tty=False)
    output = await output_of(session)
    assert b'"no-such-program": executable file not found' in output[STDERR]
    assert await asyncio.wait_for(session.wait(), 10) == 127  # as a shell reports a command it cannot find
    await session.close()


async def test_a_runtime_with_a_network_mode_gives_it_to_each_container_and_the_container_reaches_out_through_it(podman):
    """``docker_network = "slirp4netns"`` (the demo's container host): no CNI bridge, a network of the container's own."""
    rt = DockerRuntime(podman.socket_path, network="slirp4netns")
    try:
        await rt.create(spec(podman, "slirp", command=["sh", "-c", "ifconfig tap0 && sleep 300"]), labels=agent_labels("n-1"))
        raw = podman.inspect("slirp")
        assert raw["HostConfig"]["NetworkMode"] == "slirp4netns", raw["HostConfig"]
        assert raw["State"]["Running"] is True
        # slirp4netns's tap device (not CNI's veth), as the container's own ifconfig prints it
        wait_for(lambda: "inet addr:10.0.2." in podman.podman("logs", "slirp").stdout, 10, "the container's tap0 address")
    finally:
        await rt.close()
        podman.podman("rm", "--all", "--force", "--time", "0")


# --- AMD cards: device files, not a toolkit (agent/runtime/gpu_access.py) ----------------------------------------------
# No AMD GPU here: the host's /dev/null is mapped under ROCm's names (/dev/kfd, the card's render node), an existing
# character device rather than one made with mknod (which would be the same kernel device under another path, and
# prove no more). These tests check that what the runtime asks reaches a real Podman and the container, opened as
# the AMD self-test opens them; not that ROCm runs.
AMD_UUID = "GPU-4b2c4f5d21b5a3f0"


def amd_table(render="/dev/dri/renderD128", *, host="/dev/null"):
    nodes = (DeviceNode(host, render),) if render else ()
    return GpuDevices([GpuAccess(uuid=AMD_UUID, vendor="amd", nodes=nodes)], kfd=DeviceNode(host, KFD))


def amd_card(uuid=AMD_UUID):
    return GpuInfo(
        index=0,
        uuid=uuid,
        name="AMD Instinct MI300X",
        pci_bus_id="0000:05:00.0",
        memory_total_mib=196592,
        compute_capability="",
        vendor="amd",
    )


@pytest.mark.parametrize("mode", ["cdi", "device_requests"])  # Podman's own API; the Docker API, as on Docker
async def test_an_amd_cards_kfd_and_render_node_reach_its_container(podman, mode):
    rt = DockerRuntime(podman.socket_path, gpu_devices=mode, gpu_table=amd_table())
    try:
        job = spec(podman, f"amd-{mode}", gpus=[AMD_UUID], command=["sh", "-c", "ls /dev/kfd /dev/dri/renderD128 && sleep 300"])
        info = await rt.create(job, labels=agent_labels(f"cmd-amd-{mode}"))
        assert info.state == "running"
        raw = podman.inspect(f"amd-{mode}")
        given = {(d["PathOnHost"], d["PathInContainer"]) for d in raw["HostConfig"]["Devices"] or []}
        assert given == {("/dev/null", KFD), ("/dev/null", "/dev/dri/renderD128")}
        await until_logged(rt, f"amd-{mode}", b"/dev/dri/renderD128")
        assert not raw["HostConfig"].get("DeviceRequests")  # nothing asked of NVIDIA's toolkit
    finally:
        await rt.close()
        podman.podman("rm", "--all", "--force", "--time", "0")


async def test_the_amd_self_test_passes_where_the_container_opens_kfd_and_its_render_node(podman):
    rt = DockerRuntime(podman.socket_path, gpu_table=amd_table(), selftest_image=podman.image)
    try:
        (reach,) = await gpu_selftest(rt, [amd_card()])
        assert reach.reachable, reach
        assert podman.inspect("idlegrid-selftest-amd-0") is None  # it leaves nothing behind
    finally:
        await rt.close()


async def test_an_amd_card_whose_render_node_is_unknown_or_not_on_the_host_fails_the_self_test_saying_why(podman):
    unknown = DockerRuntime(podman.socket_path, gpu_table=amd_table(render=""), selftest_image=podman.image)
    missing = DockerRuntime(podman.socket_path, gpu_table=amd_table(host="/dev/no-such-kfd"), selftest_image=podman.image)
    try:
        (reach,) = await gpu_selftest(unknown, [amd_card()])
        assert not reach.reachable and "no /dev/dri render node is known" in reach.detail
        (reach,) = await gpu_selftest(missing, [amd_card()])
        assert not reach.reachable and "/dev/no-such-kfd" in reach.detail, reach
        assert "render,video" in reach.fix
    finally:
        await unknown.close()
        await missing.close()
        podman.podman("rm", "--all", "--force", "--time", "0")


async def test_a_simulated_amd_hosts_self_test_sees_each_card_by_its_rocm_name(podman):
    table = GpuDevices([GpuAccess(uuid="GPU-sim-amd-0", vendor="amd"), GpuAccess(uuid="GPU-sim-amd-1", vendor="amd")])
    rt = DockerRuntime(podman.socket_path, simulated_gpus=True, gpu_table=table, selftest_image=podman.image)
    try:
        reach = await gpu_selftest(rt, [amd_card("GPU-sim-amd-0"), amd_card("GPU-sim-amd-1")])
        assert [(r.uuid, r.reachable) for r in reach] == [("GPU-sim-amd-0", True), ("GPU-sim-amd-1", True)]
    finally:
        await rt.close()
