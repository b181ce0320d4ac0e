"""The Master of a local grid with an in-memory fake request queue registered as its ``WorkerCalls`` (through the port's
``serve_worker_calls``), for end-to-end tests of the worker API's path: ``python -m tests.support.endpoint_master
QUEUE_DIR master ...`` (the rest as ``idlegrid master`` takes it).

A fake, and said so: the real queue (management/endpoints/) is another part of issue 39, merged separately. The test
drives it through files in QUEUE_DIR, since the Master is another process:

- ``waiting/<endpoint id>--<request id>.json``: a request waiting (its input as JSON); a take of a worker of that
  endpoint claims it (renames it away), so a worker of another endpoint never sees it;
- ``done/<request id>.json``: each report of a request (``{"op", "worker": [endpoint, worker, agent], "value"}``, one
  JSON object per line);
- ``gone/<endpoint id>--<worker id>``: a worker_gone.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import management.app
from master.port import CallOutcome, TakenRequest, WorkerError, WorkerRef

POLL_S = 0.05


class FileQueue:
    def __init__(self, root: Path) -> None:
        self.root = root
        for part in ("waiting", "done", "gone"):
            (root / part).mkdir(parents=True, exist_ok=True)

    async def take(self, worker: WorkerRef, wait_s: float) -> TakenRequest | None:
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            for path in sorted((self.root / "waiting").glob(f"{worker.endpoint_id}--*.json")):
                claimed = path.with_suffix(".taken")
                try:
                    path.rename(claimed)
                except FileNotFoundError:
                    continue
                request_id = path.stem.split("--", 1)[1]
                return TakenRequest(id=request_id, input=json.loads(claimed.read_text()))
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(POLL_S)

    async def heartbeat(self, worker: WorkerRef, in_flight: list[str]) -> list[str]:
        return []

    def _done(self, op: str, worker: WorkerRef, request_id: str, value: Any) -> CallOutcome:
        line = {"op": op, "worker": [worker.endpoint_id, worker.worker_id, worker.agent_id], "value": value}
        with open(self.root / "done" / f"{request_id}.json", "a") as out:
            out.write(json.dumps(line) + "\n")
        return CallOutcome.OK

    async def partial(self, worker: WorkerRef, request_id: str, seq: int, output: Any) -> CallOutcome:
        return self._done("partial", worker, request_id, [seq, output])

    async def progress(self, worker: WorkerRef, request_id: str, progress: Any) -> CallOutcome:
        return self._done("progress", worker, request_id, progress)

    async def result(self, worker: WorkerRef, request_id: str, output: Any) -> CallOutcome:
        return self._done("result", worker, request_id, output)

    async def error(self, worker: WorkerRef, request_id: str, error: WorkerError) -> CallOutcome:
        return self._done("error", worker, request_id, {"type": error.type, "message": error.message})

    async def release(self, worker: WorkerRef, request_id: str) -> CallOutcome:
        return self._done("release", worker, request_id, None)

    async def worker_gone(self, worker: WorkerRef) -> None:
        (self.root / "gone" / f"{worker.endpoint_id}--{worker.worker_id}").touch()


def main() -> int:
    queue = FileQueue(Path(sys.argv[1]))
    start = management.app.MasterServer.start

    async def start_with_queue(server: management.app.MasterServer) -> None:
        await start(server)
        server.master.serve_worker_calls(queue)

    management.app.MasterServer.start = start_with_queue  # type: ignore[method-assign,assignment]
    from management.cli.main import main as cli

    return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
