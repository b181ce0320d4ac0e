"""Who sees which alert: the operator every alert; a provider the alerts about its hosts and their GPUs (label
``provider``); a renter the alerts about its workloads and rented GPUs (label ``renter``). Fleet-wide alerts
(no owner label) are the operator's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Viewer:
    account: str
    role: str  # "operator" | "provider" | "renter"


def visible(labels: Mapping[str, str], viewer: Viewer) -> bool:
    if viewer.role == "operator":
        return True
    if viewer.role == "provider":
        return labels.get("provider") == viewer.account
    if viewer.role == "renter":
        return labels.get("renter") == viewer.account
    return False
