"""Monitoring: telemetry history, alerts, reports and fleet series (docs/monitoring.md)."""
