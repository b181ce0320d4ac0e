"""Two renters' containers on one process-runtime host, the second hostile: it must not read the first's environment,
files, temporary files or processes, signal or trace them, or reach its ports or the host's loopback services.
Real processes, as root (the agent's production case); every attempt runs as the hostile container's command."""

import asyncio
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from agent.runtime.gpu_access import GpuAccess, GpuDevices
from agent.runtime.process import PROCESS_GPU_FIX, PROCESS_GPU_PROBE, ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.inventory import GpuInfo

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent's sandbox (uids, namespaces) needs it")

SECRET = "s3cr3t-of-renter-a"

VICTIM = textwrap.dedent(
    """
    echo "$SECRET_TOKEN" > mine.txt
    echo "$SECRET_TOKEN" > /tmp/victim-tmp.txt
    echo "$SECRET_TOKEN" > /dev/shm/victim-shm.txt
    python3 -c '
    import socket, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(open("port").read()))); s.listen(8)
    open("listening", "w").write("yes")
    while True:
        c, _ = s.accept(); c.sendall(b"victim-data"); c.close()
    '
    """
)

# Each probe prints one line "name: outcome". A probe that reaches the victim prints its data.
ATTACKER = textwrap.dedent(
    """
    import ctypes, glob, os, signal, socket, sys
    victim_dir, victim_pid, victim_port, host_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    out = []
    def probe(name, fn):
        try:
            out.append(f"{name}: " + " ".join(str(fn()).split()))
        except Exception as exc:
            out.append(f"{name}: refused {type(exc).__name__}")
    def environs():
        seen = []
        for path in glob.glob("/proc/*/environ"):
            try:
                seen.append(open(path, "rb").read().decode(errors="replace"))
            except OSError:
                pass
        return " ".join(seen)
    probe("environ", environs)
    probe("pids", lambda: " ".join(sorted(p for p in os.listdir("/proc") if p.isdigit())))
    probe("read", lambda: open(os.path.join(victim_dir, "mine.txt")).read())
    probe("list", lambda: os.listdir(victim_dir))
    probe("write", lambda: open(os.path.join(victim_dir, "planted.txt"), "w").write("x"))
    probe("tmp", lambda: open("/tmp/victim-tmp.txt").read())
    probe("shm", lambda: open("/dev/shm/victim-shm.txt").read())
    probe("kill", lambda: os.kill(victim_pid, signal.SIGKILL))
    libc = ctypes.CDLL(None, use_errno=True)
    def ptrace():
        if libc.ptrace(16, victim_pid, None, None) != 0:  # PTRACE_ATTACH
            raise PermissionError(os.strerror(ctypes.get_errno()))
        return "attached"
    probe("ptrace", ptrace)
    def connect(port):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            return s.recv(100).decode()
    probe("victim_port", lambda: connect(victim_port))
    probe("host_port", lambda: connect(host_port))
    def gateway():  # slirp4netns's address of the host: its loopback must stay out of reach there too
        with socket.create_connection(("10.0.2.2", host_port), timeout=2) as s:
            return s.recv(100).decode()
    probe("host_via_gateway", gateway)
    probe("uid", lambda: f"{os.getuid()} {os.getgid()} {os.getgroups()}")
    open("seen.tmp", "w").write("\\n".join(out) + "\\n")
    os.rename("seen.tmp", "seen")
    """
)


def labels(command_id):
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1"}


async def wait_for_file(path, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {path}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def host_service():
    """A service on the host's loopback, as the agent's, a relay's or another daemon's would be."""

    async def answer(reader, writer):
        writer.write(b"host-secret")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def test_a_hostile_container_reaches_nothing_of_another_renters_container_or_the_host(tmp_path, host_service):
    runtime = ProcessRuntime(tmp_path / "state")
    victim_port = free_port()
    victim_dir = runtime.workdir("renter-a")
    try:
        await runtime.create(
            ContainerSpec(
                name="renter-a",
                image="none",
                command=["sh", "-c", f"echo {victim_port} > port; {VICTIM}"],
                env={"SECRET_TOKEN": SECRET},
            ),
            labels=labels("cmd-a"),
        )
        await wait_for_file(victim_dir / "listening")
        victim = runtime._load("renter-a")
        assert victim is not None
        # The victim's own server, reached the way a tunnel reaches it: it is there and answers.
        reader, writer = await runtime.connect("renter-a", victim_port)
        assert await reader.read() == b"victim-data"
        writer.close()

        await runtime.create(
            ContainerSpec(
                name="renter-b",
                image="none",
                command=["python3", "-c", ATTACKER, str(victim_dir), str(victim.pid), str(victim_port), str(host_service)],
            ),
            labels=labels("cmd-b"),
        )
        seen = dict(line.split(": ", 1) for line in (await wait_for_file(runtime.workdir("renter-b") / "seen")).splitlines())
        attacker = runtime._load("renter-b")
        victim_info = await runtime.inspect("renter-a")
        victim_alive = victim_info.state if victim_info is not None else None
    finally:
        for name in ("renter-a", "renter-b"):
            await runtime.delete(name, timeout_s=0)

    assert SECRET not in "\n".join(seen.values()), seen
    assert seen["pids"].split() == sorted(seen["pids"].split()) and len(seen["pids"].split()) <= 3, seen["pids"]
    for probe in ("read", "list", "write", "tmp", "shm", "kill", "ptrace", "victim_port", "host_port", "host_via_gateway"):
        assert seen[probe].startswith("refused"), (probe, seen[probe])
    assert victim_alive == "running"
    assert attacker is not None and victim.uid != attacker.uid and seen["uid"] == f"{attacker.uid} {attacker.uid} []"


async def test_a_container_sees_its_own_proc_and_an_exec_joins_it(tmp_path):
    """CUDA needs the /proc of its own PID namespace (cudaGetDeviceCount fails with error 304 otherwise): the command
    is pid 1 of its /proc, and an exec sees the same /proc, files and temporary files as the command."""
    runtime = ProcessRuntime(tmp_path / "state")
    spec = ContainerSpec(
        name="cuda-like", image="none", command=["sh", "-c", "echo here > /tmp/mark; ls /proc > procs; mv procs self; sleep 300"]
    )
    try:
        await runtime.create(spec, labels=labels("cmd-p"))
        await wait_for_file(runtime.workdir("cuda-like") / "self")
        session = await runtime.exec(
            "cuda-like", ["sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; cat /tmp/mark"], tty=False
        )
        output = b""
        while (chunk := await asyncio.wait_for(session.read(), 10)) is not None:
            output += chunk[1]
        code = await session.wait()
        own = [entry for entry in (runtime.workdir("cuda-like") / "self").read_text().split() if entry.isdigit()]
    finally:
        await runtime.delete("cuda-like", timeout_s=0)

    assert "1" in own and len(own) <= 4, own  # its init, itself and ls: no process of the host or of others
    *init, mark = output.decode().splitlines()
    assert "idlegrid-shim" in "".join(init) and mark == "here"  # pid 1 of the exec's /proc is the container's shim
    assert code == 0


async def test_a_sandboxed_program_can_ask_who_it_is(tmp_path):
    """A container's uid has no passwd entry: Python's getpass.getuser() (which PyTorch's optimizers reach through its
    compiler's cache directory) must still answer, or every training job fails at its optimizer (seen on a real H100)."""
    runtime = ProcessRuntime(tmp_path / "state")
    spec = ContainerSpec(
        name="who", image="none", command=["python3", "-c", "import getpass, os; print(getpass.getuser(), os.getuid())"]
    )
    try:
        await runtime.create(spec, labels=labels("cmd-who"))
        deadline = time.monotonic() + 30
        while (info := await runtime.inspect("who")) is not None and info.state == "running":
            assert time.monotonic() < deadline, "the container did not end"
            await asyncio.sleep(0.1)
        assert info is not None
        output = b"".join([chunk async for _channel, chunk in runtime.logs("who", tail=-1, follow=False)]).decode()
    finally:
        await runtime.delete("who", timeout_s=0)
    assert info.exit_code == 0, output
    name, uid = output.split()
    assert name == "renter" and int(uid) != 0


async def test_the_gpu_self_test_runs_in_the_sandbox_and_says_why_a_gpu_does_not_reach_it(tmp_path):
    """Simulated GPUs (none exists here): the sandboxed container given one GPU sees it by name. The real probe
    (NVML and the CUDA driver inside the sandbox) fails here, where there is no NVIDIA driver, and says what to fix."""
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{letter * 8}-0000-0000-0000-000000000000",
            name="NVIDIA A10",
            pci_bus_id=f"0000:0{i}:00.0",
            memory_total_mib=24576,
            compute_capability="8.6",
        )
        for i, letter in enumerate("ab")
    ]
    simulated = ProcessRuntime(tmp_path / "sim", simulated_gpus=True)
    reached = await simulated.gpu_selftest(gpus)
    assert [(r.uuid, r.reachable) for r in reached] == [(g.uuid, True) for g in gpus]
    assert await simulated.list() == [] and list((tmp_path / "sim" / "containers").glob("*.json")) == []  # cleaned up

    real = ProcessRuntime(tmp_path / "real")
    [refused] = await real.gpu_selftest(gpus[:1])
    assert not refused.reachable
    assert "exited with code" in refused.detail and "NVIDIA driver" in refused.fix


async def test_the_amd_self_test_in_the_sandbox_names_each_card_for_rocr_and_says_what_is_missing(tmp_path):
    """A simulated MI300X host's cards are seen by name (ROCR_VISIBLE_DEVICES, AMD's variable); the real probe asks
    ROCm's rocminfo, which this host lacks (no AMD GPU, no ROCm), and says what to fix."""
    cards = [
        GpuInfo(
            index=i,
            uuid=f"GPU-4b2c4f5d21b5a3f{i}",
            name="AMD Instinct MI300X",
            pci_bus_id=f"0000:0{i}:00.0",
            memory_total_mib=196592,
            compute_capability="",
            vendor="amd",
        )
        for i in range(2)
    ]
    table = GpuDevices(GpuAccess(uuid=card.uuid, vendor="amd") for card in cards)
    simulated = ProcessRuntime(tmp_path / "sim", simulated_gpus=True, gpu_table=table)
    reached = await simulated.gpu_selftest(cards)
    assert [(r.uuid, r.reachable) for r in reached] == [(c.uuid, True) for c in cards]

    real = ProcessRuntime(tmp_path / "real", gpu_table=table)
    [refused] = await real.gpu_selftest(cards[:1])
    assert not refused.reachable and "rocminfo not found" in refused.detail, refused
    assert "ROCR_VISIBLE_DEVICES" in refused.fix


def test_the_providers_guide_says_the_process_runtime_runs_this_self_test_and_its_fix():
    """docs/install-provider.md once said the process runtime had no self-test (issue 37): what it says now is the
    probe and the fix above, as the code has them."""
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "install-provider.md").read_text().split())
    probe = PROCESS_GPU_PROBE[2]
    assert "no self-test" not in guide and "The process runtime runs the self-test too, with no image" in guide
    assert 'nvidia-smi -i "$CUDA_VISIBLE_DEVICES"' in guide and '-i "$CUDA_VISIBLE_DEVICES"' in probe
    assert "count exactly one device" in guide and "count.value == 1" in probe and "command -v python3" in probe
    assert "PROCESS_GPU_PROBE" in guide
    for part in ("NVIDIA driver", "/dev/nvidia*", "process_uids", "--mount-proc"):
        assert part in PROCESS_GPU_FIX and part.removeprefix("NVIDIA ") in guide, part
