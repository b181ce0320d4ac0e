"""Faults injected into simulated GPUs, so a test or the operator of a local grid can see the Master react.

A running agent with simulated GPUs reads ``<state_dir>/simulated-faults.json`` on every telemetry tick (a stat, and
a read only when the file changed). It maps a GPU UUID to what that card should report from now on:

    {"GPU-...": {"xid": 79}, "GPU-...": {"ecc_uncorrected": 3}, "GPU-...": {"temperature_c": 97}}

- ``xid``: reported once as a ``gpu_xid`` event (again only if the number changes);
- ``ecc_uncorrected``: the card's volatile uncorrectable ECC count in every sample;
- ``temperature_c``: the card's temperature in every sample.

Removing an entry (or the file) ends the injected readings. A file that does not parse is logged and ignored (the
previous faults stay in force), never a reason for the agent to stop.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

log = logging.getLogger(__name__)

FAULTS_FILE = "simulated-faults.json"


class InjectedFault(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    xid: int | None = None
    ecc_uncorrected: int | None = None
    temperature_c: float | None = None


_decoder = msgspec.json.Decoder(dict[str, InjectedFault])


class FaultInjection:
    """The faults file of one agent, read again whenever it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._faults: dict[str, InjectedFault] = {}
        self._xids_reported: dict[str, int] = {}

    def current(self) -> dict[str, InjectedFault]:
        """The faults in force now, by GPU UUID."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._faults = None, {}
            return self._faults
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._faults = _decoder.decode(self.path.read_bytes())
            except (OSError, msgspec.DecodeError) as exc:
                log.warning('ignored %s: %s; expected {uuid: {"xid"|"ecc_uncorrected"|"temperature_c": number}}', self.path, exc)
        return self._faults

    def new_xids(self) -> dict[str, int]:
        """Xids injected since the last call (GPU UUID -> Xid): each is reported once."""
        faults = self.current()
        new = {uuid: f.xid for uuid, f in faults.items() if f.xid is not None and self._xids_reported.get(uuid) != f.xid}
        self._xids_reported = {uuid: f.xid for uuid, f in faults.items() if f.xid is not None}
        return new
