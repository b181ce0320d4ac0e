"""The output of a deleted container: kept by the agent (bounded, cut with a marker) and served from there to a logs
tunnel. Real processes in the process runtime; common/output.py's bound as a specification."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.output import KEPT_STATE, KeptOutputRuntime, OutputKeeper
from agent.runtime.docker import DockerRuntime
from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_WORKLOAD_ID
from common.errors import RuntimeFailure
from common.output import CUT_MARKER, MARKER_ROOM, TailBuffer, bounded, last_lines
from common.pki import CommandSigner, CommandVerifier
from tests.agent.test_executor import AGENT, command


def test_a_tail_buffer_keeps_the_last_bytes_and_marks_the_cut() -> None:
    buffer = TailBuffer(10)
    for piece in (b"abc", b"defgh", b"ijklmnop", b"q"):
        buffer.feed(piece)
    assert buffer.seen == 17 and buffer.truncated
    assert buffer.value() == CUT_MARKER % (7, 10) + b"hijklmnopq"
    whole = TailBuffer(10)
    whole.feed(b"0123456789")
    assert whole.value() == b"0123456789" and not whole.truncated


def test_the_master_bounds_again_what_an_agent_sends() -> None:
    assert bounded(b"x" * 100, 2000) == (b"x" * 100, False)
    cut, was_cut = bounded(b"y" * 5000, 1000)
    assert was_cut and cut.startswith(b"[idlegrid: output cut: the first 4000 bytes") and cut.endswith(b"y" * 1000)
    assert bounded(cut, 1000) == (cut, True)  # an agent's marked output that fits is kept as it is
    master_reads = TailBuffer(1000 + MARKER_ROOM)  # as the Master reads one from a host with its own bound of 1000
    master_reads.feed(cut)
    assert bounded(master_reads.value(), 1000) == (cut, True)  # the agent's marker and figures survive the read


def test_last_lines_counts_a_last_line_without_its_newline() -> None:
    assert last_lines(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert last_lines(b"a\nb\nc", 2) == b"b\nc"
    assert last_lines(b"a\nb\n", 5) == b"a\nb\n"
    assert last_lines(b"a\nb\n", -1) == b"a\nb\n" and last_lines(b"a\n", 0) == b""


@pytest.fixture
def signer() -> CommandSigner:
    return CommandSigner.generate()


def agent_parts(tmp_path: Path, signer: CommandSigner, *, limit: int) -> tuple[CommandExecutor, ProcessRuntime, OutputKeeper]:
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    runtime = ProcessRuntime(state_dir=tmp_path / "state", work_root=tmp_path / "work")
    keeper = OutputKeeper(tmp_path / "state" / "output", limit=limit)
    ledger = CommandLog(tmp_path / "state" / "commands.db")
    return CommandExecutor(AGENT, ledger, runtime, verifier, keeper=keeper), runtime, keeper


async def ended(runtime: ProcessRuntime, name: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = await runtime.inspect(name)
        if info is not None and info.state != "running":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"container {name} did not end")


async def collect(runtime: KeptOutputRuntime, name: str, tail: int = -1) -> bytes:
    return b"".join([data async for _, data in runtime.logs(name, tail=tail, follow=True)])


async def test_a_deleted_containers_output_is_kept_and_served_to_a_logs_tunnel(tmp_path: Path, signer: CommandSigner) -> None:
    executor, runtime, keeper = agent_parts(tmp_path, signer, limit=1 << 20)
    script = "for i in 1 2 3; do echo out $i; done; echo 'Traceback: boom' >&2; exit 3"
    spec = {"name": "wl-ab-r0-a1", "image": "none", "command": ["sh", "-c", script], "workload_id": "wl-ab", "replica": 0}
    assert (await executor.execute(command(signer, spec=spec, command_id="c-create"))).ok
    await ended(runtime, "wl-ab-r0-a1")

    deleted = await executor.execute(command(signer, "delete_container", {"name": "wl-ab-r0-a1"}, command_id="c-del"))

    assert deleted.ok, deleted
    assert deleted.result["output"] == {"bytes": 34, "kept": 34, "truncated": False}  # sizes only, never the bytes
    assert await runtime.inspect("wl-ab-r0-a1") is None  # the container is gone from the runtime
    with pytest.raises(RuntimeFailure):  # which, on its own, no longer has its output (what was lost before)
        [_ async for _ in runtime.logs("wl-ab-r0-a1", tail=-1, follow=False)]
    served = KeptOutputRuntime(runtime, keeper)
    info = await served.inspect("wl-ab-r0-a1")
    assert info is not None and info.state == KEPT_STATE and info.exit_code == 3
    assert info.labels[LABEL_WORKLOAD_ID] == "wl-ab"  # what the tunnel server checks the ticket against
    assert await collect(served, "wl-ab-r0-a1") == b"out 1\nout 2\nout 3\nTraceback: boom\n"
    assert await collect(served, "wl-ab-r0-a1", tail=1) == b"Traceback: boom\n"
    assert (tmp_path / "state" / "output" / "wl-ab-r0-a1.out").stat().st_mode & 0o777 == 0o600

    again = await executor.execute(command(signer, "delete_container", {"name": "wl-ab-r0-a1"}, command_id="c-del-2"))
    assert again.ok and await collect(served, "wl-ab-r0-a1", tail=1) == b"Traceback: boom\n"  # a repeat keeps it


async def test_output_over_the_bound_is_cut_to_its_last_bytes_with_a_marker(tmp_path: Path, signer: CommandSigner) -> None:
    executor, runtime, keeper = agent_parts(tmp_path, signer, limit=4096)
    script = "i=0; while [ $i -lt 2000 ]; do echo line-$i; i=$((i+1)); done"
    spec = {"name": "wl-cd-r0-a1", "image": "none", "command": ["sh", "-c", script]}
    assert (await executor.execute(command(signer, spec=spec, command_id="c-create"))).ok
    await ended(runtime, "wl-cd-r0-a1")

    deleted = await executor.execute(command(signer, "delete_container", {"name": "wl-cd-r0-a1"}, command_id="c-del"))

    assert deleted.result["output"]["truncated"] and deleted.result["output"]["bytes"] > 4096
    data = keeper.read("wl-cd-r0-a1")
    assert data is not None and data.startswith(b"[idlegrid: output cut: the first ")
    assert data.endswith(b"line-1998\nline-1999\n") and len(data) < 4096 + 100


async def test_a_running_container_deleted_keeps_what_it_printed_in_its_grace_period(
    tmp_path: Path, signer: CommandSigner
) -> None:
    """Cancel, preemption, a balance run out: SIGTERM, then the grace. What the container prints on its way out (a
    checkpoint's last words) is kept too, and the exit status its handler gave."""
    executor, runtime, keeper = agent_parts(tmp_path, signer, limit=1 << 20)
    spec = {"name": "wl-ef-r0-a1", "image": "none", "command": ["sh", "-c", TRAPPING]}
    assert (await executor.execute(command(signer, spec=spec, command_id="c-create"))).ok
    deadline = time.monotonic() + 10
    while b"started" not in b"".join([d async for _, d in runtime.logs("wl-ef-r0-a1", tail=-1, follow=False)]):
        assert time.monotonic() < deadline, "the container never printed"
        await asyncio.sleep(0.05)

    deleted = await executor.execute(
        command(signer, "delete_container", {"name": "wl-ef-r0-a1", "timeout_s": 10}, command_id="c-del")
    )

    assert deleted.ok
    kept_bytes = keeper.read("wl-ef-r0-a1")
    assert kept_bytes is not None  # (the shell also reports its foreground sleep "Terminated": the group got SIGTERM)
    assert kept_bytes.startswith(b"started\n") and kept_bytes.endswith(b"got SIGTERM, saving\n")
    kept = keeper.get("wl-ef-r0-a1")
    assert kept is not None and kept.exit_code == 7


# Prints once its trap is set; on SIGTERM prints its last words and exits 7 (a code only the handler gives).
TRAPPING = "trap 'echo got SIGTERM, saving; exit 7' TERM; echo started; while :; do sleep 0.1; done"


def test_kept_output_is_dropped_past_its_retention_then_oldest_first_over_the_budget(tmp_path: Path) -> None:
    keeper = OutputKeeper(tmp_path, limit=1024, retention_s=100.0, budget_bytes=250)
    for name, at in (("old", 0.0), ("mid", 150.0), ("new", 160.0)):
        record_bytes = b"z" * 100
        (tmp_path / f"{name}.out").write_bytes(record_bytes)
        (tmp_path / f"{name}.json").write_text(f'{{"name": "{name}", "kept": 100, "kept_at": {at}}}')
    assert keeper.prune(now=170.0) == 1  # "old" is past its retention; the other two fit the budget of 250
    assert keeper.read("old") is None and keeper.get("mid") is not None
    (tmp_path / "newest.out").write_bytes(b"z" * 100)
    (tmp_path / "newest.json").write_text('{"name": "newest", "kept": 100, "kept_at": 165.0}')
    assert keeper.prune(now=170.0) == 1  # 300 bytes over a budget of 250: the oldest ("mid") goes
    assert keeper.get("mid") is None and keeper.get("new") is not None and keeper.read("newest") == b"z" * 100


@pytest.mark.podman
async def test_a_real_podman_containers_output_is_kept_when_the_docker_runtime_deletes_it(
    tmp_path: Path, signer: CommandSigner, podman: Any
) -> None:
    """The docker runtime against Podman's Docker API: stdout and stderr come apart from the engine and are kept
    together, in the order the engine gives them."""
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    runtime = DockerRuntime(podman.socket_path)
    keeper = OutputKeeper(tmp_path / "output", limit=1 << 20)
    executor = CommandExecutor(AGENT, CommandLog(tmp_path / "commands.db"), runtime, verifier, keeper=keeper)
    script = "echo to-out; echo to-err >&2; exit 3"
    spec = {"name": "wl-bd-r0-a1", "image": podman.image, "command": ["sh", "-c", script], "workload_id": "wl-bd"}
    try:
        assert (await executor.execute(command(signer, spec=spec, command_id="c-create"))).ok
        deadline = time.monotonic() + 30
        while (info := await runtime.inspect("wl-bd-r0-a1")) is not None and info.state not in ("exited", "dead"):
            assert time.monotonic() < deadline, "the container did not end"
            await asyncio.sleep(0.1)

        deleted = await executor.execute(command(signer, "delete_container", {"name": "wl-bd-r0-a1"}, command_id="c-del"))

        assert deleted.ok, deleted
        assert await runtime.inspect("wl-bd-r0-a1") is None
        served = KeptOutputRuntime(runtime, keeper)
        kept = await collect(served, "wl-bd-r0-a1")
        assert sorted(kept.splitlines()) == [b"to-err", b"to-out"]
        info = await served.inspect("wl-bd-r0-a1")
        assert info is not None and info.exit_code == 3 and info.labels[LABEL_WORKLOAD_ID] == "wl-bd"
    finally:
        podman.podman("rm", "--all", "--force", "--time", "0")
        await runtime.close()


@pytest.mark.podman
async def test_a_real_podman_container_deleted_while_running_keeps_its_last_words(
    tmp_path: Path, signer: CommandSigner, podman: Any
) -> None:
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    runtime = DockerRuntime(podman.socket_path)
    keeper = OutputKeeper(tmp_path / "output", limit=1 << 20)
    executor = CommandExecutor(AGENT, CommandLog(tmp_path / "commands.db"), runtime, verifier, keeper=keeper)
    spec = {"name": "wl-be-r0-a1", "image": podman.image, "command": ["sh", "-c", TRAPPING]}
    try:
        assert (await executor.execute(command(signer, spec=spec, command_id="c-create"))).ok
        deadline = time.monotonic() + 30
        while b"started" not in b"".join([d async for _, d in runtime.logs("wl-be-r0-a1", tail=-1, follow=False)]):
            assert time.monotonic() < deadline, "the container never printed"
            await asyncio.sleep(0.1)

        deleted = await executor.execute(
            command(signer, "delete_container", {"name": "wl-be-r0-a1", "timeout_s": 20}, command_id="c-del")
        )

        assert deleted.ok and keeper.read("wl-be-r0-a1") == b"started\ngot SIGTERM, saving\n"
    finally:
        podman.podman("rm", "--all", "--force", "--time", "0")
        await runtime.close()
