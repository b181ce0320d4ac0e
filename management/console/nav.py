"""The console's navigation: each page module lists its entries (``NAV``), shown to the roles they name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NavItem:
    role: str  # "operator" | "provider" | "renter": the role whose navigation shows it
    label: str
    path: str  # /console/...
    order: int = 100  # smaller first
    badge: str = ""  # the name of a count shown beside the label when not 0 (rendering.nav_counts), e.g. "alerts"
