"""The local grid's endpoint worker: echoes its request's input, streaming each word of a ``prompt`` as a partial
output first. It runs on the handler library alone, as a renter's image would carry it: as ``idlegrid_worker`` in the
demo's worker image (podman_host.py ``WORKER``), or as ``common.endpoint_worker`` from a checkout of idlegrid.

``python echo_worker.py`` serves until SIGTERM, where the agent's environment says (docs/endpoints.md)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypedDict

try:
    from idlegrid_worker import Request, serve  # in an image: the library alone
except ImportError:
    from common.endpoint_worker import Request, serve


class Echoed(TypedDict):
    echo: Any  # the request's input, whatever JSON it was
    words: int
    attempt: int


def handler(request: Request) -> Generator[str, None, Echoed]:
    """Each word of the input's ``prompt`` as a partial output, then the input back with the count of words."""
    given: Any = request.input
    prompt = given.get("prompt", "") if isinstance(given, dict) else ""
    words = str(prompt).split()
    yield from words
    return {"echo": given, "words": len(words), "attempt": request.attempt}


if __name__ == "__main__":
    serve(handler)
