"""Monitoring: telemetry history, alerts, fleet series and reports (docs/monitoring.md)."""
