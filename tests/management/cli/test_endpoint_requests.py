"""``idlegrid endpoint run|request|health`` against a real Master server, through the CLI's own entry point, as renter
ana (her API key) and as her client (an invocation key, --key or IDLEGRID_ENDPOINT_KEY); the endpoint's worker is
played through the composed book's worker calls (docs/endpoints.md, "The request routes")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from management.cli import main as cli
from master.port import WorkerError, WorkerRef
from tests.management.endpoints.test_api_requests import Grid, grid, receiver

__all__ = ["grid", "receiver"]  # the fixtures, from the API's tests


class Cli:
    def __init__(self, grid: Grid, capsys: pytest.CaptureFixture[str]) -> None:
        self.grid = grid
        self.capsys = capsys

    async def __call__(self, *argv: str, key: dict[str, str] | None = None) -> tuple[int, str, str]:
        """``idlegrid ARGV`` as ana, or with ``key`` (an Authorization header) as the invocation key."""
        self.capsys.readouterr()
        auth = key or self.grid.ana
        option = "--key" if key is not None else "--api-key"
        line = [*argv, "--api", self.grid.server.api_url, option, auth["Authorization"].removeprefix("Bearer ")]
        code = await asyncio.to_thread(cli.main, line)
        out, err = self.capsys.readouterr()
        return code, out, err


async def test_run_status_stream_cancel_retry_and_health_read_as_a_stranger_would(grid: Grid, capsys, tmp_path: Path):
    run = Cli(grid, capsys)
    endpoint, key = await grid.endpoint(grid.ana)
    code, out, err = await run("endpoint", "run", endpoint, "--input", '{"prompt": "hi"}', key=key)
    assert code == 0, err
    [rid] = [r.id for r in grid.book.open_of(endpoint)]
    assert out == f"request {rid} queued\nfollow it: idlegrid endpoint request status {endpoint} {rid}\n"

    code, out, _ = await run("endpoint", "request", "status", endpoint, rid, key=key)
    assert code == 0 and out.startswith(f"request:    {rid}\nstatus:     IN_QUEUE\n")
    worker = WorkerRef(endpoint, "w1", "agent-1")
    await grid.book.take(worker, 0)
    await grid.book.partial(worker, rid, 0, "Hel")
    await grid.book.partial(worker, rid, 1, {"text": "lo"})
    streaming = asyncio.create_task(run("endpoint", "request", "stream", endpoint, rid, key=key))
    await asyncio.sleep(0.2)
    await grid.book.result(worker, rid, {"text": "Hello"})
    code, out, err = await asyncio.wait_for(streaming, 60)
    assert code == 0 and out == '"Hel"\n{"text": "lo"}\n' and err == f"request {rid} COMPLETED\n"
    code, out, _ = await run("endpoint", "request", "status", endpoint, rid)  # ana's own API key
    assert code == 0 and "status:     COMPLETED\n" in out and out.endswith('output:\n{\n  "text": "Hello"\n}\n')

    input_file = tmp_path / "input.json"
    input_file.write_text('{"prompt": "from a file"}')
    code, out, _ = await run("endpoint", "run", endpoint, "--input", f"@{input_file}", "--sync", "--wait", "0.05", key=key)
    assert code == 0 and "status:     IN_QUEUE\n" in out and "not done after 0.05 s; follow it:" in out
    [pending] = grid.book.open_of(endpoint)
    assert pending.input == '{"prompt":"from a file"}'
    code, out, _ = await run("endpoint", "request", "cancel", endpoint, pending.id, key=key)
    assert (code, out) == (0, f"request {pending.id} cancelled\n")
    code, out, _ = await run("endpoint", "request", "retry", endpoint, pending.id, key=key)
    assert code == 0 and out.startswith(f"request {pending.id} queued again (attempt 2)\n")

    synced = asyncio.create_task(run("endpoint", "run", endpoint, "--input", "[1, 2]", "--sync", key=key))
    taken = [await grid.book.take(worker, 5) for _ in range(2)]
    mine = next(t for t in taken if t is not None and t.input == [1, 2])
    await grid.book.error(worker, mine.id, WorkerError("ValueError", "two is too many", "Traceback (most recent call last):"))
    code, out, _ = await asyncio.wait_for(synced, 60)
    assert code == 1  # ended otherwise than completed
    assert "status:     FAILED\n" in out and "error:      ValueError: two is too many\n" in out and "traceback:\n" in out

    code, out, _ = await run("endpoint", "health", endpoint, key=key)
    assert code == 0 and out == (
        "requests: 0 in queue, 1 in progress, 1 completed, 1 failed, 0 cancelled, 0 timed out\n"  # the retried one runs
        "workers:  1 ready (1 running, 0 idle)\n"
    ), out


async def test_bad_input_and_keys_of_another_endpoint_are_said_plainly(grid: Grid, capsys, monkeypatch, tmp_path: Path):
    run = Cli(grid, capsys)
    a, key_a = await grid.endpoint(grid.ana, name="a")
    b, _ = await grid.endpoint(grid.ana, name="b")
    code, _, err = await run("endpoint", "run", a, "--input", "{prompt: hi}", key=key_a)
    assert code != 0 and err.startswith("idlegrid endpoint run: --input: not JSON: ") and "quote it" in err
    code, _, err = await run("endpoint", "run", a, "--input", f"@{tmp_path / 'missing.json'}", key=key_a)
    assert code != 0 and "cannot read it" in err
    code, _, err = await run("endpoint", "run", b, "--input", "1", key=key_a)
    assert code != 0 and f"invokes endpoint {a} only" in err
    code, _, err = await run("endpoint", "run", a, "--input", '"' + "x" * (1 << 20) + '"', key=key_a)
    assert code != 0 and "1048576 bytes" in err
    assert grid.book.open_of(a) == grid.book.open_of(b) == []

    monkeypatch.setenv("IDLEGRID_ENDPOINT_KEY", key_a["Authorization"].removeprefix("Bearer "))
    line = ["endpoint", "health", a, "--api", grid.server.api_url]
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, line) == 0
    assert capsys.readouterr().out.startswith("requests: 0 in queue")
