"""What the egress tests share (common/egress.py): a counting listener, and resolvers that never ask DNS.

The counting listener is a plain TCP socket listening on 127.0.0.1 that never answers. ``connections()`` takes every
connection the kernel completed for it (a connection counts even when its client already gave up and closed it). A test
that points a refused target at it and finds 0 shows nothing was connected, not merely that an answer was refused."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from types import TracebackType

import pytest

from common.egress import Resolver


def resolving(table: Mapping[str, str]) -> Resolver:
    """A name server that answers from ``table`` only (a name not in it does not resolve); never real DNS."""

    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's table")
        return [table[host]]

    return resolve


def resolving_to_loopback(host: str, port: int) -> list[str]:
    """A name server that answers every name with this host's loopback (what a renter's own DNS can do)."""
    return ["127.0.0.1"]


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    """A counting listener for one test."""
    with CountingListener() as counting:
        yield counting


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
