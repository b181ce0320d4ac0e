"""The secret fields of a ``create_container`` command, sealed while the command is at rest.

A create command carries what its host needs in clear: env values (the renter's ``${secret:NAME}`` resolved among
them), the registry password, the object storage keys. The command's record is written to the store at every step
(pending, sent, acked, final), and from there into backups and MongoDB replicas; so the record keeps those fields
sealed with the Master's secret key (``master/secrets.py``'s ``SecretBox``, Fernet) and the command is made whole
again only in memory, to be signed and sent (and resent after a reconnect).

``split(spec)`` -> (the spec as stored, with ``SEALED`` in place of each secret value; the secret values, or None when
the spec has none); ``join(stored, secrets)`` is its inverse. Pure: no key, no I/O. The ledger seals what ``split``
takes out, once per command, and a command with no secret field (every delete, a create with no env, registry
password or storage) costs nothing.

Invariants (tests/master/test_command_secrets.py): ``join(*split(spec)) == spec`` for every spec; the stored spec holds
no secret value; the stored spec still names every env variable, the registry username, the storage key id and an
endpoint worker's ids, which answers show; a stored spec whose ``secrets`` were lost still parses as a
``ContainerSpec``.
"""

from __future__ import annotations

import msgspec

from common.containers import WireSpec

SEALED = "<sealed>"  # what the stored spec holds in place of a secret value
SEALED_TOKEN = "<sealed-worker-token>"  # the same for a worker token, long enough that the stored spec still parses

_STORAGE_SECRET_KEYS = ("secret_access_key", "session_token")


class CommandSecrets(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What ``split`` took out of a spec: sealed as one value beside the stored command."""

    env: dict[str, str] = {}
    registry_password: str | None = None
    storage: dict[str, str] = {}  # secret_access_key, session_token
    worker_token: str | None = None  # an endpoint worker's bearer token (docs/endpoints.md)


def split(spec: WireSpec) -> tuple[WireSpec, CommandSecrets | None]:
    """The spec as it may be stored, and the secret values it held (None: it held none, and is stored as it is)."""
    secrets = CommandSecrets()
    stored = dict(spec)
    env = spec.get("env")
    if isinstance(env, dict) and env:
        secrets.env = {str(k): v for k, v in env.items()}
        stored["env"] = dict.fromkeys(env, SEALED)
    auth = spec.get("registry_auth")
    if isinstance(auth, dict) and isinstance(auth.get("password"), str):
        secrets.registry_password = auth["password"]
        stored["registry_auth"] = {**auth, "password": SEALED}
    storage = spec.get("storage")
    credentials = storage.get("credentials") if isinstance(storage, dict) else None
    if isinstance(storage, dict) and isinstance(credentials, dict):
        secrets.storage = {k: credentials[k] for k in _STORAGE_SECRET_KEYS if isinstance(credentials.get(k), str)}
        if secrets.storage:
            kept = {k: v for k, v in credentials.items() if k not in _STORAGE_SECRET_KEYS}
            stored["storage"] = {**storage, "credentials": {**kept, "secret_access_key": SEALED}}
    worker = spec.get("endpoint_worker")
    if isinstance(worker, dict) and isinstance(worker.get("token"), str):
        secrets.worker_token = worker["token"]
        stored["endpoint_worker"] = {**worker, "token": SEALED_TOKEN}
    if not (secrets.env or secrets.registry_password is not None or secrets.storage or secrets.worker_token is not None):
        return spec, None
    return stored, secrets


def join(stored: WireSpec, secrets: CommandSecrets) -> WireSpec:
    """The spec ``split`` was given: ``stored`` with the secret values back in place."""
    spec = dict(stored)
    if secrets.env:
        spec["env"] = {**stored.get("env", {}), **secrets.env}
    if secrets.registry_password is not None:
        spec["registry_auth"] = {**stored["registry_auth"], "password": secrets.registry_password}
    if secrets.worker_token is not None:
        spec["endpoint_worker"] = {**stored["endpoint_worker"], "token": secrets.worker_token}
    if secrets.storage:
        storage = stored["storage"]
        credentials = {k: v for k, v in storage["credentials"].items() if k not in _STORAGE_SECRET_KEYS}
        spec["storage"] = {**storage, "credentials": {**credentials, **secrets.storage}}
    return spec


def encode_secrets(secrets: CommandSecrets) -> bytes:
    return msgspec.json.encode(secrets)


def decode_secrets(data: bytes) -> CommandSecrets:
    return msgspec.json.decode(data, type=CommandSecrets)
