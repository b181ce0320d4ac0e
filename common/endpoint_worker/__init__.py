"""The handler library of an endpoint's workers: ``def handler(request): ...`` and ``serve(handler)``.

    from idlegrid_worker import serve     # this folder, copied into the image under any name

    def handler(request):
        request.progress({"step": 1})
        return {"echo": request.input}

    if __name__ == "__main__":
        serve(handler)

A handler may return a value (the request's output, any JSON), raise (the request fails with the exception's type,
message and traceback), be a generator (each item a partial output streamed as it is made, its ``return`` value the
result), a coroutine function or an async generator. ``serve`` runs ``IDLEGRID_WORKER_CONCURRENCY`` requests at
once, each on its own thread, and ends on SIGTERM once the requests in flight are done.

Standard library only, and nothing else of idlegrid: every import inside this folder is relative, so the folder
works wherever it is copied (tests/common/endpoint_worker/ proves it in a bare interpreter). contract.py is the API it
speaks (docs/endpoints.md).
"""

from .client import AgentUnavailable, BadAnswer, BodyTooLarge, RequestGone, TokenRefused, WorkerAPI, WorkerAPIError
from .serve import Request, serve

__all__ = [
    "AgentUnavailable",
    "BadAnswer",
    "BodyTooLarge",
    "Request",
    "RequestGone",
    "TokenRefused",
    "WorkerAPI",
    "WorkerAPIError",
    "serve",
]
