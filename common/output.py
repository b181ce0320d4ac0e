"""A container's output kept after it ends: bounded to its last bytes, cut with a marker a person can read.

Shared by the agent, which keeps the output of a container it deletes (agent/output.py), and the Master, which reads
it from the agent and stores it (management/services/outputs.py) and bounds it again: it trusts no agent's figure.
"""

from __future__ import annotations

DEFAULT_OUTPUT_LIMIT = 8 * 1024 * 1024  # bytes of a container's output kept: the last ones
CUT_MARKER = b"[idlegrid: output cut: the first %d bytes were dropped, the last %d are kept]\n"
MARKER_ROOM = len(CUT_MARKER) + 40  # a marker's length at most (two numbers of up to 20 digits each)


class TailBuffer:
    """The last ``limit`` bytes of a stream fed in pieces, in memory bounded by ``limit`` plus one piece."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"an output bound of {limit} bytes keeps nothing; it must be at least 1")
        self.limit = limit
        self.seen = 0  # bytes fed in all
        self._pieces: list[bytes] = []
        self._held = 0

    def feed(self, data: bytes) -> None:
        self.seen += len(data)
        self._pieces.append(data)
        self._held += len(data)
        while self._held - len(self._pieces[0]) >= self.limit:  # the first piece is wholly outside the bound
            self._held -= len(self._pieces.pop(0))

    @property
    def truncated(self) -> bool:
        return self.seen > self.limit

    def value(self) -> bytes:
        """The kept bytes, after a ``CUT_MARKER`` line when some were dropped."""
        kept = b"".join(self._pieces)[-self.limit :]
        if not self.truncated:
            return kept
        return CUT_MARKER % (self.seen - len(kept), len(kept)) + kept


def bounded(data: bytes, limit: int = DEFAULT_OUTPUT_LIMIT) -> tuple[bytes, bool]:
    """``data`` cut to its last ``limit`` bytes (marked), and whether it was cut. Kept output that already carries a
    marker and fits is returned as it is."""
    if len(data) <= limit + MARKER_ROOM:  # what an agent kept with the same bound, its marker included
        return data, data.startswith(b"[idlegrid: output cut:")
    buffer = TailBuffer(limit)
    buffer.feed(data)
    return buffer.value(), True


def last_lines(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines of ``data`` (-1: all of it); a last line without its newline counts."""
    if lines < 0:
        return data
    if lines == 0:
        return b""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    at = end
    for _ in range(lines):
        at = data.rfind(b"\n", 0, at)
        if at < 0:
            return data
    return data[at + 1 :]
