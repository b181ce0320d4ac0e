"""Anomalies beyond fixed thresholds: a GPU whose temperature leaves its own recent range at the same utilization.

Per GPU and per utilization band (``BANDS``: 0-25, 25-50, 50-75, 75-100 %), an exponentially weighted mean and
variance of the temperature (``ALPHA`` per sample, so the last ~``1 / ALPHA`` samples weigh most). A sample is judged
against its band once that band has seen ``WARM_UP`` samples: its score is ``|temperature - mean| / max(std,
STD_FLOOR_C)`` (a z-score; the floor keeps a very steady card from being flagged for a degree). A card that heats
because it works harder moves to another band and is compared with itself at that load, not flagged.

The score is fed to the alert rules as ``gpu.temperature_anomaly`` (management/monitoring/observe.py), through the
same sparse machinery as any telemetry metric: a point is kept only when it breaches a rule (or the GPU already has
an alert), so a normal fleet costs no points.

A sample scored over ``LEARN_GATE`` updates its band ``SLOW`` times more slowly: a card that runs hot stays flagged
rather than teaching its baseline within minutes, and a lasting change (a new room, new paste) is learned over hours.

Memory: every GPU's figures live in three flat arrays (float32 means and variances, uint16 counts) indexed by a
slot, plus one dict entry mapping the GPU's uuid to its slot: about 40 bytes of figures a GPU and the dict's entry.
A GPU gone from the fleet frees its slot (``forget_except``) for the next one.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Collection
from math import isfinite, sqrt

BANDS = 4  # utilization bands of 25 % each
ALPHA = 0.02  # weight of a new sample in its band's mean and variance
WARM_UP = 30  # samples in a band before it judges (5 minutes at one sample each 10 s)
STD_FLOOR_C = 2.0  # the smallest spread a band is credited with, °C
LEARN_GATE = 3.0  # a sample scored over this updates its band SLOW times more slowly
SLOW = 20
_COUNT_CAP = 65_535
_PER_PCT = BANDS / 100.0


def band_of(utilization_pct: float) -> int:
    """The utilization band of a sample: 0 for 0-25 %, ..., BANDS - 1 for 75-100 % (out-of-range values clamped)."""
    if not utilization_pct > 0:  # also NaN
        return 0
    return min(BANDS - 1, int(utilization_pct * BANDS / 100.0))


class TemperatureBaselines:
    """Each GPU's temperature per utilization band, as running figures; ``observe`` scores and learns a sample."""

    __slots__ = ("_slots", "_free", "_mean", "_var", "_count")

    def __init__(self) -> None:
        self._slots: dict[str, int] = {}  # uuid -> slot
        self._free: list[int] = []  # slots of forgotten GPUs
        self._mean = array("f")  # slot * BANDS + band
        self._var = array("f")
        self._count = array("H")

    def __len__(self) -> int:
        return len(self._slots)

    def observe(self, uuid: str, utilization_pct: float, temperature_c: float) -> float | None:
        """Score the sample against the GPU's band (None while the band warms up, or for a value that is not a
        number), then learn it. Called for every sample of the fleet: kept to a few operations."""
        if not (isfinite(temperature_c) and isfinite(utilization_pct)):
            return None
        slot = self._slots.get(uuid)
        if slot is None:
            slot = self._slot_for(uuid)
        band = 0 if utilization_pct <= 0 else BANDS - 1 if utilization_pct >= 100 else int(utilization_pct * _PER_PCT)
        at = slot * BANDS + band
        count = self._count[at]
        if count == 0:
            self._mean[at], self._var[at], self._count[at] = temperature_c, 0.0, 1
            return None
        mean, var = self._mean[at], self._var[at]
        deviation = temperature_c - mean
        score = None
        alpha = ALPHA
        if count >= WARM_UP:
            spread = sqrt(var)
            score = abs(deviation) / (spread if spread > STD_FLOOR_C else STD_FLOOR_C)
            if score > LEARN_GATE:
                alpha = ALPHA / SLOW
        # exponentially weighted mean and variance (West's update)
        self._mean[at] = mean + alpha * deviation
        self._var[at] = (1.0 - alpha) * (var + alpha * deviation * deviation)
        if count < _COUNT_CAP:
            self._count[at] = count + 1
        return score

    def expected(self, uuid: str, utilization_pct: float) -> tuple[float, float, int] | None:
        """The band's (mean, std, samples) for this GPU at this utilization; None for a GPU never seen."""
        slot = self._slots.get(uuid)
        if slot is None:
            return None
        at = slot * BANDS + band_of(utilization_pct)
        return (self._mean[at], math.sqrt(self._var[at]), self._count[at])

    def forget_except(self, keep: Collection[str]) -> int:
        """Forget the GPUs not in ``keep`` (gone from the fleet); how many were forgotten."""
        gone = [uuid for uuid in self._slots if uuid not in keep]
        for uuid in gone:
            slot = self._slots.pop(uuid)
            for at in range(slot * BANDS, slot * BANDS + BANDS):
                self._count[at] = 0
            self._free.append(slot)
        return len(gone)

    def _slot_for(self, uuid: str) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._count) // BANDS
            self._mean.extend(_ZEROS_F)
            self._var.extend(_ZEROS_F)
            self._count.extend(_ZEROS_H)
        self._slots[uuid] = slot
        return slot


_ZEROS_F = array("f", [0.0] * BANDS)
_ZEROS_H = array("H", [0] * BANDS)
