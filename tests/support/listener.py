"""A counting listener: a plain TCP socket listening on 127.0.0.1 that never answers. ``connections()`` takes every
connection the kernel completed for it (a connection counts even when its client already gave up and closed it). A test
that points a refused target at it and finds 0 shows nothing was connected, not merely that an answer was refused."""

from __future__ import annotations

import socket
from types import TracebackType


class CountingListener:
    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self._accepted = 0

    def connections(self) -> int:
        """How many connections reached this listener so far."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return self._accepted
            self._accepted += 1
            conn.close()

    def __enter__(self) -> CountingListener:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._sock.close()
