"""``bench endpoints --load-client wrk``: Debian's wrk plays the many clients through bench/wrk_runsync.lua. Here it
loads a real aiohttp server standing in for the Master's runsync route, so what the script counts is checked against
what the server answered: completed answers, answers that are not (a 200 whose status is FAILED, a 429), the key and
the body it sent. The whole bench runs it against a real grid in test_smoke.py."""

from __future__ import annotations

import itertools
import shutil

import pytest
from aiohttp import web

from bench.endpoints import PAYLOAD, Endpoint, _wrk_clients, load_client

needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="Debian's wrk is not installed (scripts/setup-env --test)")


@needs_wrk
async def test_wrk_counts_completed_answers_and_reports_the_others() -> None:
    seen: list[tuple[str, dict]] = []
    turns = itertools.count()

    async def runsync(request: web.Request) -> web.Response:
        seen.append((request.headers["Authorization"], await request.json()))
        turn = next(turns)
        if turn % 10 == 3:
            return web.json_response({"error": "rate limited"}, status=429)
        status = "FAILED" if turn % 10 == 7 else "COMPLETED"
        return web.json_response({"id": str(turn), "status": status, "output": {"echo": "x"}})

    app = web.Application()
    app.router.add_post("/api/v1/endpoints/ep-1/runsync", runsync)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        endpoint = Endpoint(None, None, "ep-1", "igek_secret")  # type: ignore[arg-type]  # no HTTP of its own here
        row = await _wrk_clients(endpoint, f"http://127.0.0.1:{port}", 4, 1.4)  # wrk takes whole seconds: 1
    finally:
        await runner.cleanup()
    answered = len(seen)
    failed = sum(1 for turn in range(answered) if turn % 10 in (3, 7))
    assert answered >= 20
    # wrk may cut the last answers short at its deadline: those are neither counted nor failed.
    assert answered - 4 - failed <= row["n"] <= answered - failed
    assert row["client"] == "wrk" and row["requests_per_s"] > 0 and 0 < row["p50"] <= row["p99"]
    assert {key for key, _ in seen} == {"Bearer igek_secret"} and all(body == {"input": PAYLOAD} for _, body in seen)
    assert len(endpoint.errors) == 1 and "answers not COMPLETED" in endpoint.errors[0]
    assert "429" in endpoint.errors[0] or "FAILED" in endpoint.errors[0]


def test_the_load_client_is_chosen_or_refused_by_name() -> None:
    assert load_client("python") == "python"
    assert load_client("auto") == ("wrk" if shutil.which("wrk") else "python")
    with pytest.raises(ValueError, match="auto, wrk or python"):
        load_client("ab")
