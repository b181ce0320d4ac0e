"""The aggregates the store keeps, named once for both backends, the metrics and the quarantine."""

from __future__ import annotations

from enum import Enum


class Aggregate(str, Enum):
    """The aggregates the store keeps; each value names its SQLite table and its MongoDB collection alike.

    Also the ``aggregate`` label of the store's metrics and of quarantined records, so that label is bounded.
    """

    AGENTS = "agents"
    GPUS = "gpus"
    COMMANDS = "commands"
    TOKENS = "tokens"
    API_KEYS = "api_keys"
    EVENTS = "events"
    REVOCATIONS = "revocations"
    ROLLUPS = "rollups"
    ACCOUNTS = "accounts"
    WORKLOADS = "workloads"


def workload_order(created_at: float, workload_id: str) -> str:
    """Where a workload sorts in lists, in both backends: by creation time, then id, as one comparable string."""
    return f"{created_at:020.6f}|{workload_id}"


def rollup_key(gpu_uuid: str, minute: int) -> str:
    """The key of one GPU's rollup of one minute, in both backends (MongoDB's ``_id``)."""
    return f"{gpu_uuid}:{minute}"
