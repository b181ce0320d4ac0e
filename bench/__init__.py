"""Benchmarks of the whole grid: ``python -m bench fleet`` and ``python -m bench ingest`` (see bench/README.md)."""
