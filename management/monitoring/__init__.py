"""Monitoring: telemetry history, alert rules and notifications, reports, fleet series."""
