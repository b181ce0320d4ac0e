"""A guard on CPython's one-character strings (and one-byte bytes), which every ``" "`` literal of the process shares.

CI saw, in one test process at a time, a space become NUL everywhere at once: a relay's parser read ``GET\\x00/``
("Expected space after method: b'\\x00'"), a page rendered ``{{ ' ' ~ state }}`` as ``No workloadsrunning`` and
``join(' ')`` with nothing between, and botocore read a bare CRLF for an S3 answer's status line. Something had written
into the shared ``" "`` object. After each test this guard reads every one-character Latin-1 string back (``chr(i)``
returns the shared object; ``ord`` reads its byte) and fails the test that was running when one changed, naming it, so
that the culprit is found the first time it strikes and not blamed on the tests that ran after it.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

_FAILED_ALREADY: list[str] = []


_ALL_BYTES = bytes(range(256))


def corrupted() -> list[str]:
    """The one-character strings and one-byte bytes whose character is no longer their own, as ``code -> now`` (a
    slice of one byte is the shared one-byte object, as ``chr`` gives the shared string)."""
    strings = [f"{i:#04x} -> {ord(chr(i)):#04x}" for i in range(256) if len(chr(i)) != 1 or ord(chr(i)) != i]
    octets = [_ALL_BYTES[i : i + 1] for i in range(256)]
    return strings + [f"b{i:#04x} -> b{b[0]:#04x}" for i, b in enumerate(octets) if len(b) != 1 or b[0] != i]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield
    if _FAILED_ALREADY:
        return
    changed = corrupted()
    if changed:
        _FAILED_ALREADY.append(item.nodeid)
        raise AssertionError(
            f"this test's process had its shared one-character strings overwritten while it ran: {', '.join(changed)} "
            "(tests/support/singletons.py); every later test of this process will see it"
        )
