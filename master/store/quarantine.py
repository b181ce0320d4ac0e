"""Records the store found in its database but could not decode: kept aside, reported, never fatal.

A record written by a buggy or older version, or edited by hand, must not stop the Master from
starting, nor fail a whole listing. The repository that meets one skips it (a ``get`` answers None),
logs it once with its aggregate and key, and adds it here; the row or document stays in the
database untouched, for an operator to repair or delete. Writing a good record under the same key
replaces the bad one, so it leaves the quarantine.

The Master takes the records not yet reported (``take_unreported``) and records one event each; the
metrics read ``counts`` at scrape time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec

log = logging.getLogger(__name__)

Raw = TypeVar("Raw")
Decoded = TypeVar("Decoded")

# Everything a stored record can fail to decode with: bad JSON, a field missing or of the wrong type, a value
# out of range, a SQLite doc that is not text.
DECODE_ERRORS = (msgspec.MsgspecError, TypeError, ValueError)

REASON_MAX_CHARS = 300  # a decoder's message can quote the record; the log and the event need only its start


class QuarantinedRecord(msgspec.Struct, frozen=True, kw_only=True):
    aggregate: str  # an ``Aggregate``, or a plugged aggregate's name (master/store/plugin.py)
    key: str  # the record's key in its table or collection (an id, a hash, "<gpu_uuid>:<minute>", an event seq)
    backend: str
    reason: str  # why it did not decode
    found_at: float


class Quarantine:
    """The undecodable records one store has met, one entry per (aggregate, key).

    Thread-safe: the SQLite backend decodes on its worker thread.
    """

    def __init__(self, backend: str, *, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self._clock = clock
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str], QuarantinedRecord] = {}
        self._unreported: list[QuarantinedRecord] = []

    def decode_each(
        self, aggregate: str, raw: Iterable[Raw], decode: Callable[[Raw], Decoded], key_of: Callable[[Raw], object]
    ) -> list[Decoded]:
        """Each of ``raw`` (rows, documents) decoded; those that fail are added here and left out."""
        decoded = []
        for item in raw:
            try:
                decoded.append(decode(item))
            except DECODE_ERRORS as exc:
                self.add(aggregate, key_of(item), exc)
        return decoded

    def add(self, aggregate: str, key: object, error: Exception) -> None:
        """Note one record that failed to decode; logged the first time it is met."""
        reason = f"{type(error).__name__}: {error}"[:REASON_MAX_CHARS]
        found = QuarantinedRecord(aggregate=aggregate, key=str(key), backend=self.backend, reason=reason, found_at=self._clock())
        with self._lock:
            if (aggregate, found.key) in self._found:
                return
            self._found[aggregate, found.key] = found
            self._unreported.append(found)
        log.warning(
            "undecodable store record quarantined: skipped and left in the database",
            extra={"aggregate": str(aggregate), "key": found.key, "backend": self.backend, "reason": reason},
        )

    def release(self, aggregate: str, keys: Iterable[object]) -> None:
        """Forget records just overwritten by good ones."""
        if not self._found:  # the common case, without taking the lock
            return
        with self._lock:
            for key in keys:
                self._found.pop((aggregate, str(key)), None)

    @property
    def records(self) -> list[QuarantinedRecord]:
        """Every record in quarantine now, in the order found."""
        with self._lock:
            return list(self._found.values())

    def counts(self) -> Counter[str]:
        """How many records of each aggregate are in quarantine now."""
        with self._lock:
            return Counter(aggregate for aggregate, _ in self._found)

    def __len__(self) -> int:
        return len(self._found)

    def take_unreported(self) -> list[QuarantinedRecord]:
        """The records found since the last call (each is handed out once), for the Master to record as events."""
        with self._lock:
            taken, self._unreported = self._unreported, []
        return taken
