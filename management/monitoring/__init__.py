"""Monitoring: telemetry history, alerts, reports and the Prometheus series of the fleet and the market (docs/monitoring.md)."""
