"""Accounts' SSH public keys (docs/ssh.md): the keys the platform's SSH end lets an account's sessions in with.

Every account manages its own (add, list, delete); the operator any account's. A key is checked when it is added
(an OpenSSH public key line of a type OpenSSH offers), stored without its comment, and known by its fingerprint
(OpenSSH's ``SHA256:...``), which is what an SSH ticket carries to the agent.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa

from common.errors import Conflict, IdlegridError, NotFound
from management.store import SshKeyRepo
from master.port import MasterPort, SshKeyRecord, WorkloadRecord

KEY_ID_PREFIX = "sshk-"
MAX_KEYS_PER_ACCOUNT = 20  # each key's fingerprint travels in every SSH ticket of the account, in a header
MAX_KEY_NAME = 100
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
MIN_RSA_BITS = 2048


class InvalidSshKey(IdlegridError):
    """A public key the platform cannot use (the request's fault: 400)."""

    code = "invalid_ssh_key"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's fingerprint of a key blob: ``SHA256:`` and the unpadded base64 of its SHA-256."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def parse_public_key(line: str) -> tuple[str, str, str]:
    """``(public_key, fingerprint, comment)`` of an OpenSSH public key line (``ssh-ed25519 AAAA... me@laptop``), or
    InvalidSshKey saying what is wrong with it."""
    parts = line.strip().split(None, 2)
    if len(parts) < 2:
        raise InvalidSshKey(
            "public_key: an OpenSSH public key line, 'TYPE BASE64 [COMMENT]' (the contents of ~/.ssh/id_ed25519.pub)"
        )
    kind, text = parts[0], parts[1]
    if kind not in KEY_TYPES:
        raise InvalidSshKey(f"public_key: type {kind[:40]!r} is not one of {', '.join(KEY_TYPES)}")
    try:
        blob = base64.b64decode(text, validate=True)
        key = serialization.load_ssh_public_key(f"{kind} {text}".encode("ascii"))
    except (binascii.Error, ValueError, UnicodeError) as exc:
        raise InvalidSshKey(f"public_key: not a valid {kind} key ({exc})") from None
    if isinstance(key, dsa.DSAPublicKey):
        raise InvalidSshKey("public_key: DSA keys are not accepted; use ssh-ed25519")
    size = getattr(key, "key_size", None)
    if kind == "ssh-rsa" and isinstance(size, int) and size < MIN_RSA_BITS:
        raise InvalidSshKey(f"public_key: an RSA key of {size} bits is too short; use {MIN_RSA_BITS} or more, or ssh-ed25519")
    comment = parts[2].strip() if len(parts) > 2 else ""
    return f"{kind} {text}", fingerprint(blob), comment


@dataclass(frozen=True)
class ReplicaHostKey:
    """The SSH host key of one replica of a workload, as its host reported it (None: a host that reported none)."""

    replica: int
    agent_id: str
    state: str  # the replica's container: "running", "exited", ...
    host_key: str | None  # "ssh-ed25519 AAAA..."


def host_alias(workload_id: str, replica: int) -> str:
    """The name ``ssh`` knows a replica by: the workload's id for replica 0, ``<id>.r<N>`` for the others."""
    return workload_id if replica == 0 else f"{workload_id}.r{replica}"


class SshKeysService:
    """``Services.ssh_keys``: add, list and delete an account's SSH public keys; a workload's SSH host keys."""

    def __init__(self, master: MasterPort, keys: SshKeyRepo, workloads: Callable[..., Awaitable[WorkloadRecord]]) -> None:
        self._master = master
        self._keys = keys  # the store's collection of SSH keys
        self._workload = workloads  # WorkloadsService.get_workload: 404 for another account's

    async def host_keys(self, workload_id: str, *, owner: str | None) -> tuple[WorkloadRecord, builtins.list[ReplicaHostKey]]:
        """The host key of each placed replica of a workload its owner (or an operator) may reach: the public half
        its host put in the result of the create command that started the container (agent/ssh_host_keys.py)."""
        workload = await self._workload(workload_id, account=owner)
        found = []
        for assignment in sorted(workload.assignments, key=lambda a: a.replica):
            key = None
            if assignment.command_id:
                try:
                    command = await self._master.command(assignment.command_id)
                except NotFound:
                    command = None
                reported = (command.result or {}).get("ssh_host_key") if command is not None else None
                key = reported if isinstance(reported, str) and reported.startswith("ssh-ed25519 ") else None
            found.append(ReplicaHostKey(assignment.replica, assignment.agent_id, assignment.state, key))
        return workload, found

    async def add(self, account: str, public_key: str, *, name: str = "") -> SshKeyRecord:
        """Register ``public_key`` for ``account`` (the caller checked it may act for it); Conflict when the account
        has that key already or as many keys as it may."""
        key, print_, comment = parse_public_key(public_key)
        await self._master.accounts.get(account)  # NotFound for an account that does not exist
        own = await self._keys.list(account=account)
        if any(k.fingerprint == print_ for k in own):
            raise Conflict(f"account {account} has key {print_} already")
        if len(own) >= MAX_KEYS_PER_ACCOUNT:
            raise Conflict(f"account {account} has {len(own)} SSH keys, the most one account may; delete one first")
        record = SshKeyRecord(
            id=KEY_ID_PREFIX + secrets.token_hex(8),
            account=account,
            name=(name or comment or print_)[:MAX_KEY_NAME],
            public_key=key,
            fingerprint=print_,
            created_at=time.time(),
        )
        await self._keys.put(record)
        await self._master.record_event("ssh_key.added", account, key=record.id, fingerprint=print_)
        return record

    async def list(self, *, owner: str | None, account: str | None = None) -> builtins.list[SshKeyRecord]:
        """The keys ``owner`` may see (None: the operator, every account's, or ``account``'s), by creation."""
        return await self._keys.list(account=owner if owner is not None else account)

    async def delete(self, key_id: str, *, owner: str | None) -> SshKeyRecord:
        """Remove a key; another account's answers NotFound, as a missing one does."""
        found = [k for k in await self._keys.list(account=owner) if k.id == key_id]
        if not found:
            raise NotFound(f"no SSH key {key_id!r}")
        await self._keys.delete(key_id)
        await self._master.record_event("ssh_key.deleted", found[0].account, key=key_id, fingerprint=found[0].fingerprint)
        return found[0]

    async def fingerprints(self, account: str) -> builtins.list[str]:
        """What an SSH ticket of ``account`` names: the fingerprints of its keys."""
        return [k.fingerprint for k in await self._keys.list(account=account)]
