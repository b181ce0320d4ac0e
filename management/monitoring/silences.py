"""Silences: an operator (or an owner, for its own alerts) mutes the notifications of matching alerts until an
expiry. A silenced transition is still recorded as an event; only its webhook deliveries are held back.

A silence (master.records.SilenceRecord) matches a transition when every matcher it sets agrees: the rule's name,
the subject, and each label. The book holds the silences in force; the store keeps them (settings.py writes both).
"""

from __future__ import annotations

from collections.abc import Iterable

from management.monitoring.evaluator import AlertTransition
from master.port import SilenceRecord


def matches(silence: SilenceRecord, transition: AlertTransition) -> bool:
    if silence.rule is not None and silence.rule != transition.rule:
        return False
    if silence.subject is not None and silence.subject != transition.subject:
        return False
    return all(transition.labels.get(k) == v for k, v in silence.labels.items())


class SilenceBook:
    """The silences in force, in memory; expired ones are dropped as they are met."""

    def __init__(self, silences: Iterable[SilenceRecord] = ()) -> None:
        self._silences: dict[str, SilenceRecord] = {s.id: s for s in silences}

    def put(self, silence: SilenceRecord) -> None:
        self._silences[silence.id] = silence

    def in_force(self, now: float) -> list[SilenceRecord]:
        for silence_id in [s.id for s in self._silences.values() if s.expires_at <= now]:
            del self._silences[silence_id]
        return sorted(self._silences.values(), key=lambda s: (s.created_at, s.id))

    def silenced(self, transition: AlertTransition, now: float) -> bool:
        return any(matches(s, transition) for s in self.in_force(now))
