"""SSH's answers (docs/ssh.md): an account's public keys, and a workload's host keys with the lines ``~/.ssh/config``
and ``known_hosts`` take."""

from __future__ import annotations

from management.services.ssh_keys import ReplicaHostKey, host_alias
from management.views.base import Time, View, rfc3339
from master.port import SshKeyRecord, WorkloadRecord


class SshKeyView(View):
    id: str
    account: str
    name: str
    public_key: str
    fingerprint: str
    created_at: Time


class SshKeyList(View):
    items: list[SshKeyView]


class ReplicaSshView(View):
    replica: int
    host: str  # the name ssh knows it by (Host in ~/.ssh/config, the proxy's %h)
    agent_id: str
    state: str
    host_key: str | None  # null: its host reported none (an older agent); restart the workload to get one
    known_hosts: str | None  # the line for ~/.ssh/known_hosts


class WorkloadSshView(View):
    workload: str
    replicas: list[ReplicaSshView]


def ssh_key_view(k: SshKeyRecord) -> SshKeyView:
    return SshKeyView(
        id=k.id,
        account=k.account,
        name=k.name,
        public_key=k.public_key,
        fingerprint=k.fingerprint,
        created_at=rfc3339(k.created_at) or "",
    )


def ssh_key_list_view(keys: list[SshKeyRecord]) -> SshKeyList:
    return SshKeyList(items=[ssh_key_view(k) for k in keys])


def workload_ssh_view(workload: WorkloadRecord, keys: list[ReplicaHostKey]) -> WorkloadSshView:
    """Each placed replica: the name ssh knows it by, its host, and its host key as a ``known_hosts`` line."""
    replicas = []
    for k in keys:
        alias = host_alias(workload.id, k.replica)
        line = f"{alias} {k.host_key}" if k.host_key else None
        replicas.append(
            ReplicaSshView(
                replica=k.replica, host=alias, agent_id=k.agent_id, state=k.state, host_key=k.host_key, known_hosts=line
            )
        )
    return WorkloadSshView(workload=workload.id, replicas=replicas)
