"""Reports along dimensions (management/monitoring/reports.py), as the operator, a provider or a renter sees them."""

from __future__ import annotations

from management.monitoring.report_source import ReportSource
from management.monitoring.reports import Report


class ReportsService:
    def __init__(self, source: ReportSource, currency: str) -> None:
        self._source = source
        self._currency = currency

    async def report(
        self,
        kind: str,
        by: tuple[str, ...],
        start: float,
        end: float,
        *,
        provider: str | None = None,
        renter: str | None = None,
    ) -> tuple[Report, str]:
        """The report and the grid's currency, as ``provider`` (its hosts' rows) or ``renter`` (its rentals') sees it;
        neither: the operator's, every row."""
        report = await self._source.report(kind, by, start, end, provider=provider, renter=renter)
        return report, self._currency
