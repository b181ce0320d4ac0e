"""What both backends check of a ledger entry before writing any of it."""

from __future__ import annotations

from master.records import LedgerEntry
from master.store.errors import UnbalancedEntry


def refuse_unbalanced(entry: LedgerEntry) -> None:
    """UnbalancedEntry unless ``entry`` has lines and they sum to zero (double entry: money moves, never appears)."""
    if not entry.lines:
        raise UnbalancedEntry(f"ledger entry {entry.key!r} has no lines: an entry moves money from one account to another")
    total = sum(line.amount for line in entry.lines)
    if total != 0:
        raise UnbalancedEntry(
            f"ledger entry {entry.key!r} is unbalanced: its lines sum to {total} micro-units, not 0; "
            "every amount taken off one account must be put onto another"
        )
