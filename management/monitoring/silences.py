"""Silences: an operator (or an owner, for its own alerts) mutes the notifications of matching alerts until an
expiry. A silenced transition is still recorded as an event; only its webhook deliveries are held back.

A silence matches a transition when every matcher it sets agrees: the rule's name, the subject, and each label.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import msgspec

from common.errors import InvalidAlertSetting
from management.monitoring.evaluator import AlertTransition


class Silence(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    expires_at: float
    created_at: float
    created_by: str
    rule: str | None = None
    subject: str | None = None
    labels: dict[str, str] = {}
    comment: str = ""

    def active(self, now: float) -> bool:
        return now < self.expires_at

    def matches(self, transition: AlertTransition) -> bool:
        if self.rule is not None and self.rule != transition.rule:
            return False
        if self.subject is not None and self.subject != transition.subject:
            return False
        return all(transition.labels.get(k) == v for k, v in self.labels.items())


class SilenceBook:
    """The silences in force (in memory; expired ones are dropped when asked)."""

    def __init__(self) -> None:
        self._silences: dict[str, Silence] = {}

    def create(
        self,
        *,
        created_by: str,
        expires_at: float,
        now: float,
        rule: str | None = None,
        subject: str | None = None,
        labels: Mapping[str, str] | None = None,
        comment: str = "",
    ) -> Silence:
        if expires_at <= now:
            raise InvalidAlertSetting("expires_at must be in the future")
        silence = Silence(
            id="sil-" + secrets.token_hex(6),
            expires_at=expires_at,
            created_at=now,
            created_by=created_by,
            rule=rule,
            subject=subject,
            labels=dict(labels or {}),
            comment=comment,
        )
        self._silences[silence.id] = silence
        return silence

    def expire(self, silence_id: str, now: float) -> Silence | None:
        """End ``silence_id`` now; None when there is no such silence in force."""
        silence = self._silences.pop(silence_id, None)
        if silence is None or not silence.active(now):
            return None
        return msgspec.structs.replace(silence, expires_at=now)

    def in_force(self, now: float) -> list[Silence]:
        for silence_id in [s.id for s in self._silences.values() if not s.active(now)]:
            del self._silences[silence_id]
        return sorted(self._silences.values(), key=lambda s: s.created_at)

    def silenced(self, transition: AlertTransition, now: float) -> bool:
        return any(s.matches(transition) for s in self.in_force(now))
