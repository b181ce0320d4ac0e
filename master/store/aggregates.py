"""The Master's aggregates in its store, named once for both backends, the metrics and the quarantine.

Management's own aggregates are not here: each is named by its plugin in management/store/ (docs/store.md).
"""

from __future__ import annotations

from enum import StrEnum


class Aggregate(StrEnum):
    """The Master's aggregates; each value names its SQLite table and its MongoDB collection alike.

    Also the ``aggregate`` label of the store's metrics and of quarantined records, which is bounded by these and the
    plugged aggregates' names (master/store/plugin.py). A ``StrEnum``: a member is that name, a plain ``str``.
    """

    AGENTS = "agents"
    GPUS = "gpus"
    COMMANDS = "commands"
    TOKENS = "tokens"
    API_KEYS = "api_keys"
    EVENTS = "events"
    REVOCATIONS = "revocations"
    ROLLUPS = "rollups"
    HOURLY_ROLLUPS = "hourly_rollups"
    ACCOUNTS = "accounts"
    # host telemetry history: one host's own readings, by minute and by hour (keyed by host_rollup_key)
    HOST_ROLLUPS = "host_rollups"
    HOST_HOURLY_ROLLUPS = "host_hourly_rollups"
    SECRETS = "secrets"  # renters' secrets, encrypted (keyed by secret_key)


def host_rollup_key(agent_id: str, minute: int) -> str:
    """The key of one host's rollup of one minute (or hour), in both backends (MongoDB's ``_id``)."""
    return f"{agent_id}:{minute}"


def rollup_key(gpu_uuid: str, minute: int) -> str:
    """The key of one GPU's rollup of one minute, in both backends (MongoDB's ``_id``)."""
    return f"{gpu_uuid}:{minute}"


def secret_key(account: str, name: str) -> str:
    """The key of one account's secret, in both backends: the account id (which has no "/"), "/", the name."""
    return f"{account}/{name}"
