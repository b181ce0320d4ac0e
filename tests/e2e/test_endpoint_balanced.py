"""Load-balanced endpoints on a real local grid (docs/endpoints.md, "Load-balanced mode"): the Master whole (its
links listener, the endpoints' pool and autoscaler inside), a relay and sandboxed process-runtime hosts with simulated
GPUs, each its own process (tests/support/grid.py). Each worker is a tiny stdlib ``http.server`` carried in its
command, as the echo worker is; requests go to the endpoint's one URL on the links listener with its invocation key,
and reach a worker through the Master's tunnel to its port (hosts never listen).

- A burst at zero workers is held, not dropped: the holds are the autoscaler's queue (it starts two workers), nothing
  reaches a worker until its readiness path answers 200, then every held request is served.
- Requests in flight at once spread over the two ready workers by least outstanding requests; an answer streams back
  as the worker writes it.
- A client gone mid-request gives its worker's count back.
- A worker whose readiness path stops answering 200 leaves the pool: the next requests all go to the other.
- Past the endpoint's hold bounds a request is a 503 with Retry-After and the reason; a key of another endpoint is 403,
  none 401; a queue-mode endpoint has no URL there.
- With nothing to do the workers go back to zero after the idle timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_endpoint_scaling import SANDBOXED, scaling_grid, workers_of  # noqa: F401  (the grid fixture)
from tests.e2e.test_endpoint_workers import SYSTEM_PYTHON, Endpoint
from tests.support.grid import Grid, free_port, wait_for

# The worker: an HTTP server on the port its argv names. /health answers 200 once DROP/ready exists and while no
# DROP/unready-<its id> does, and appends each answer to DROP/asked-<its id>; /hold/<n> notes its arrival in
# DROP/arrived-<its id>-<n> and answers once DROP/release exists; /stream sends a line, then the rest once DROP/more
# exists; /block notes DROP/blocked-<its id> and answers once DROP/unblock exists; anything else echoes what it got.
# Every answer names the worker (a random id of its process).
SERVER = r"""
import http.server, json, os, secrets, sys, time

ME = secrets.token_hex(4)
DROP = os.environ["DROP"]


def exists(name):
    return os.path.exists(os.path.join(DROP, name))


def wait(name):
    deadline = time.monotonic() + 120
    while not exists(name) and time.monotonic() < deadline:
        time.sleep(0.05)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.serve(b"")

    def do_POST(self):
        self.serve(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def serve(self, body):
        if self.path == "/health":
            ready = exists("ready") and not exists("unready-" + ME)
            with open(os.path.join(DROP, "asked-" + ME), "a") as asked:
                asked.write("200\n" if ready else "503\n")
            return self.answer(200 if ready else 503, {"ready": ready})
        if self.path.startswith("/hold/"):
            open(os.path.join(DROP, "arrived-" + ME + "-" + self.path.rsplit("/", 1)[1]), "w").close()
            wait("release")
        if self.path == "/block":
            open(os.path.join(DROP, "blocked-" + ME), "w").close()
            wait("unblock")
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in (b"data: first\n\n", None, b"data: second\n\n", b"data: [DONE]\n\n", b""):
                if line is None:
                    wait("more")
                    continue
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            return None
        return self.answer(200, {
            "worker": ME, "method": self.command, "path": self.path, "body": body.decode(),
            "authorization": self.headers.get("Authorization"), "prefix": self.headers.get("X-Forwarded-Prefix"),
        })

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="sandboxed hosts need root and a system Python"
    ),
]


def balanced(grid: Grid, name: str, drop: Path, **spec: Any) -> Endpoint:
    port = free_port()
    return Endpoint(
        grid,
        name,
        command=[SYSTEM_PYTHON, "-c", SERVER, str(port)],
        env={"DROP": str(drop)},
        replica={"gpus": 1},
        mode="load_balanced",
        http_port=port,
        readiness_path="/health",
        **spec,
    )


def send(grid: Grid, endpoint_id: str, path: str, key: str | None, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request to the endpoint's URL on the links listener: (status, headers, body)."""
    url = urlsplit(grid.links_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=150)
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        conn.request("POST", f"/e/{endpoint_id}/{path}", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def scale(grid: Grid, endpoint: Endpoint) -> dict[str, Any]:
    return dict(grid.get(f"/api/v1/endpoints/{endpoint.id}")["scale"] or {})


def asked(drop: Path) -> dict[str, list[str]]:
    """Each worker's readiness answers so far, by its id."""
    return {p.name.removeprefix("asked-"): p.read_text().split() for p in drop.glob("asked-*")}


def test_a_burst_is_held_until_ready_then_spread_by_least_outstanding_and_back_to_zero(scaling_grid, drop):  # noqa: F811
    grid = scaling_grid
    for n in range(2):
        grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED)
    llm = balanced(
        grid, "llm", drop, scaling={"max_workers": 2, "idle_timeout_s": 300, "concurrency": 1, "target_queue_delay_s": 1}
    )
    made = grid.get(f"/api/v1/endpoints/{llm.id}")
    assert made["url"] == f"{grid.links_url}/e/{llm.id}/" and made["spec"]["mode"] == "load_balanced"
    assert workers_of(grid, "llm") == []

    # A burst at zero workers: held (none dropped), the autoscaler told, two workers started.
    with ThreadPoolExecutor(8) as pool:
        burst = [pool.submit(send, grid, llm.id, f"v1/echo?n={i}", llm.key, f'{{"n": {i}}}'.encode()) for i in range(4)]
        wait_for(lambda: scale(grid, llm).get("waiting") == 4, 30, "the four held requests counted as waiting")
        wait_for(lambda: len(workers_of(grid, "llm")) == 2, 30, "two workers asked for")
        # Both run and are asked their readiness path, which answers 503: nothing reaches them, nothing is dropped.
        wait_for(lambda: len(asked(drop)) == 2 and all(len(a) >= 2 for a in asked(drop).values()), 90, "readiness asked")
        assert not any(f.done() for f in burst), [f.result() for f in burst if f.done()]
        assert scale(grid, llm)["workers"] == {"starting": 2, "ready": 0}
        (drop / "ready").touch()
        answers = [f.result(timeout=60) for f in burst]
    assert [status for status, _, _ in answers] == [200] * 4, answers
    echoed = [json.loads(body) for _, _, body in answers]
    assert [(e["method"], e["path"], e["body"]) for e in echoed] == [
        ("POST", f"/v1/echo?n={i}", f'{{"n": {i}}}') for i in range(4)
    ]
    assert {e["authorization"] for e in echoed} == {None}  # the invocation key is never the worker's
    assert {e["prefix"] for e in echoed} == {f"/e/{llm.id}"}
    wait_for(lambda: scale(grid, llm)["workers"] == {"starting": 0, "ready": 2}, 30, "both workers ready")
    cold = scale(grid, llm)["cold_starts_s"]
    assert len(cold) == 2 and all(c > 0 for c in cold)

    # Four in flight at once over two ready workers: two each (least outstanding, ties rotating).
    with ThreadPoolExecutor(8) as pool:
        held = [pool.submit(send, grid, llm.id, f"hold/{i}", llm.key) for i in range(4)]
        wait_for(lambda: len(list(drop.glob("arrived-*"))) == 4, 60, "the four requests at their workers")
        per_worker: dict[str, int] = {}
        for arrived in drop.glob("arrived-*"):
            me = arrived.name.split("-")[1]
            per_worker[me] = per_worker.get(me, 0) + 1
        assert sorted(per_worker.values()) == [2, 2], per_worker
        (drop / "release").touch()
        assert [f.result(timeout=60)[0] for f in held] == [200] * 4

    # An answer streams back as the worker writes it: the first event arrives while the worker waits to send the rest.
    url = urlsplit(grid.links_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    conn.request("POST", f"/e/{llm.id}/stream", headers={"Authorization": f"Bearer {llm.key}"})
    streamed = conn.getresponse()
    assert streamed.status == 200 and streamed.getheader("Content-Type") == "text/event-stream"
    assert streamed.read1() == b"data: first\n\n"
    (drop / "more").touch()
    assert streamed.read() == b"data: second\n\ndata: [DONE]\n\n"
    conn.close()

    # A client that goes away mid-request gives its worker's count back: the next requests spread over both workers
    # again (with the count kept, the blocked worker would hold one more, and every request would go to the other).
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    conn.request("POST", f"/e/{llm.id}/block", headers={"Authorization": f"Bearer {llm.key}"})
    wait_for(lambda: list(drop.glob("blocked-*")), 30, "the request at its worker")
    conn.close()
    seen: set[str] = set()

    def both_seen() -> bool:
        seen.add(json.loads(send(grid, llm.id, "v1/echo", llm.key)[2])["worker"])
        return len(seen) == 2

    wait_for(both_seen, 30, "requests at both workers again")
    (drop / "unblock").touch()

    # A worker whose readiness path stops answering 200 leaves the pool: every next request goes to the other.
    [gone, kept] = sorted(per_worker)
    (drop / f"unready-{gone}").touch()
    # Two failed asks take it out; a third comes from a later refresh of the pool, so the first two are applied.
    wait_for(lambda: asked(drop)[gone][-3:] == ["503"] * 3, 30, "three failed readiness asks in a row")
    served_by = [json.loads(send(grid, llm.id, "v1/echo", llm.key)[2])["worker"] for _ in range(4)]
    assert served_by == [kept] * 4

    # With nothing to do, back to zero after the idle timeout (made short now: the steps above took longer than it).
    (drop / f"unready-{gone}").unlink()
    status, _ = grid.call("PATCH", f"/api/v1/endpoints/{llm.id}", {"scaling": {"idle_timeout_s": 2}})
    assert status == 200
    wait_for(lambda: not sum(scale(grid, llm)["workers"].values()), 120, "the workers back to zero")


def test_hold_bounds_answer_503_with_retry_after_and_keys_of_another_endpoint_are_refused(scaling_grid, drop):  # noqa: F811
    grid = scaling_grid
    grid.run_agent("host-0", simulate="a10:1", env=SANDBOXED)
    # No worker can ever start (max_workers 0): every request is held, one at most, for 2 s at most.
    stuck = balanced(grid, "stuck", drop, scaling={"max_workers": 0}, max_held=1, max_hold_s=2)
    other = balanced(grid, "other", drop)
    queued = Endpoint(grid, "queued")  # queue mode: no URL on the links listener

    first: list[tuple[int, dict[str, str], bytes]] = []
    waiting = threading.Thread(target=lambda: first.append(send(grid, stuck.id, "v1/x", stuck.key)))
    waiting.start()
    wait_for(lambda: scale(grid, stuck).get("waiting") == 1, 30, "the first request held")
    status, headers, body = send(grid, stuck.id, "v1/x", stuck.key)
    assert status == 503 and headers["Retry-After"] == "5", body
    assert "max_held" in json.loads(body)["error"]["message"]
    waiting.join(30)
    [(status, headers, body)] = first
    assert status == 503 and headers["Retry-After"] == "5" and "max_hold_s" in json.loads(body)["error"]["message"]

    status, _, body = send(grid, stuck.id, "v1/x", other.key)
    assert status == 403 and f"not {stuck.id!r}" in json.loads(body)["error"]["message"]
    status, headers, _ = send(grid, stuck.id, "v1/x", None)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    status, _, _ = send(grid, stuck.id, "v1/x", "igek_not-a-key")
    assert status == 401
    status, _, body = send(grid, queued.id, "v1/x", queued.key)
    assert status == 404 and "queue mode" in json.loads(body)["error"]["message"]
    assert grid.get(f"/api/v1/endpoints/{queued.id}")["url"] is None


def test_a_proxied_request_past_its_execution_timeout_is_a_504_and_a_stream_past_it_is_cut(scaling_grid, drop):  # noqa: F811
    grid = scaling_grid
    grid.run_agent("host-0", simulate="a10:1", env=SANDBOXED)
    (drop / "ready").touch()
    slow = balanced(grid, "slow", drop, scaling={"max_workers": 1, "concurrency": 2}, execution_timeout_s=2)
    status, _, body = send(grid, slow.id, "v1/echo", slow.key)  # held while its worker comes up, then answered
    assert status == 200, body

    # No answer within the 2 s: a 504 that says why, while the worker still holds the request.
    status, _, body = send(grid, slow.id, "block", slow.key)
    assert status == 504, body
    error = json.loads(body)["error"]
    assert error["code"] == "execution_timeout" and "execution_timeout_s (2 s)" in error["message"]
    assert list(drop.glob("blocked-*")), "the request never reached the worker"

    # An answer that began in time and still streams at 2 s is cut: a short body, never one that looks complete.
    url = urlsplit(grid.links_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.request("POST", f"/e/{slow.id}/stream", body=b"", headers={"Authorization": f"Bearer {slow.key}"})
        answer = conn.getresponse()
        assert answer.status == 200
        with pytest.raises(http.client.IncompleteRead) as cut:
            answer.read()
        assert b"data: first" in cut.value.partial and b"[DONE]" not in cut.value.partial
    finally:
        conn.close()

    # Both timed-out requests gave their worker's count back: the next one is answered by it.
    status, _, body = send(grid, slow.id, "v1/echo", slow.key)
    assert status == 200 and json.loads(body)["path"] == "/v1/echo", body
    assert scale(grid, slow)["workers"]["ready"] == 1
    (drop / "unblock").touch()
