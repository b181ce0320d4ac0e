"""The Master of a local grid, whole (its composition, the request book and the endpoints' autoscaler included), with a
file drop through which an end-to-end test submits requests to the book and reads their states, since the Master is
another process and the request routes are another part of issue 39: ``python -m tests.support.book_master DROP_DIR
master ...`` (the rest as ``idlegrid master`` takes it).

- ``submit/<endpoint id>--<name>.json``: a request's input (JSON); the drop submits it to the book once (the file is
  renamed ``.sent``);
- ``status/<name>.json``: the request as the book holds it now (``{"id", "state", "attempt", "output"}``), rewritten
  when it changes.

Nothing else is faked: the workers are the autoscaler's workloads, placed by the scheduler on the grid's hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import management.app
from management.endpoints.queue import value_of
from management.endpoints.requests import RequestBook

POLL_S = 0.05


async def drop_requests(root: Path, book: RequestBook) -> None:
    for part in ("submit", "status"):
        (root / part).mkdir(parents=True, exist_ok=True)
    names: dict[str, str] = {}  # name -> request id
    shown: dict[str, str] = {}  # name -> the status last written
    while True:
        for path in sorted((root / "submit").glob("*--*.json")):
            endpoint_id, name = path.stem.split("--", 1)
            submitted = await book.submit(endpoint_id, json.loads(path.read_text()))
            names[name] = submitted.id
            path.rename(path.with_suffix(".sent"))
        for name, request_id in names.items():
            rec = await book.status(request_id)
            if rec is None:
                continue
            status = json.dumps({"id": rec.id, "state": rec.state, "attempt": rec.attempt, "output": value_of(rec.output)})
            if shown.get(name) != status:
                tmp = root / "status" / f"{name}.tmp"
                tmp.write_text(status)
                tmp.rename(root / "status" / f"{name}.json")
                shown[name] = status
        await asyncio.sleep(POLL_S)


def main() -> int:
    root = Path(sys.argv[1])
    start, stop = management.app.MasterServer.start, management.app.MasterServer.stop
    tasks: list[asyncio.Task[None]] = []

    async def start_with_drop(server: management.app.MasterServer) -> None:
        await start(server)
        book = dict(server.composition.state)["endpoint requests"]
        assert isinstance(book, RequestBook)
        tasks.append(asyncio.create_task(drop_requests(root, book), name="request drop"))

    async def stop_drop(server: management.app.MasterServer) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await stop(server)

    management.app.MasterServer.start = start_with_drop  # type: ignore[method-assign,assignment]
    management.app.MasterServer.stop = stop_drop  # type: ignore[method-assign,assignment]
    from management.cli.main import main as cli

    return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
