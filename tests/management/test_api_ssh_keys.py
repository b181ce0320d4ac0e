"""SSH public keys through the API on a real Master (SQLite): each account adds, lists and deletes its own, the
operator anyone's; a bad key is a 400 naming the field; a key twice is a 409 (docs/ssh.md)."""

from __future__ import annotations

import base64
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from management.store import ssh_key_repo
from tests.management.hosts import api_key
from tests.management.test_api_workloads import submit


def openssh_public(key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey, comment: str = "") -> str:
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".strip()


def openssh_fingerprint(line: str) -> str:
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


async def test_each_account_manages_its_own_ssh_keys_and_the_operator_every_accounts(api):
    ana = await api_key(api.master, "renter", "ana")
    bo = await api_key(api.master, "renter", "bo")
    line = openssh_public(ed25519.Ed25519PrivateKey.generate(), "ana@laptop")
    added = await api.post("/api/v1/ssh-keys", json={"public_key": line}, headers=ana)
    assert added.status == 201, await added.text()
    key = await added.json()
    assert key["account"] == "ana" and key["name"] == "ana@laptop"
    assert key["public_key"] == " ".join(line.split()[:2])  # stored without its comment
    assert key["fingerprint"] == openssh_fingerprint(line)

    again = await api.post("/api/v1/ssh-keys", json={"public_key": line}, headers=ana)
    assert again.status == 409 and key["fingerprint"] in (await again.json())["error"]["message"]
    assert [k["id"] for k in (await (await api.get("/api/v1/ssh-keys", headers=ana)).json())["items"]] == [key["id"]]
    assert (await (await api.get("/api/v1/ssh-keys", headers=bo)).json())["items"] == []
    everyone = (await (await api.get("/api/v1/ssh-keys", headers=api.auth)).json())["items"]
    assert [k["id"] for k in everyone] == [key["id"]]
    theirs = await api.post("/api/v1/ssh-keys", json={"public_key": line, "account": "bo"}, headers=ana)
    assert theirs.status == 403  # a renter adds keys to its own account only
    assert (await api.delete(f"/api/v1/ssh-keys/{key['id']}", headers=bo)).status == 404  # not bo's: as if absent
    assert (await api.delete(f"/api/v1/ssh-keys/{key['id']}", headers=ana)).status == 204
    assert await ssh_key_repo(api.master.store).list() == []

    # The operator adds a key to a renter's account.
    for_bo = await api.post("/api/v1/ssh-keys", json={"public_key": line, "account": "bo", "name": "ci"}, headers=api.auth)
    assert for_bo.status == 201 and (await for_bo.json())["account"] == "bo" and (await for_bo.json())["name"] == "ci"
    assert len((await (await api.get("/api/v1/ssh-keys", headers=bo)).json())["items"]) == 1
    events = [e.kind for e in await api.master.store.events.list(kind_prefix="ssh_key.")]
    assert events == ["ssh_key.added", "ssh_key.deleted", "ssh_key.added"]


async def test_a_key_that_is_no_usable_openssh_public_key_is_a_400_naming_the_field(api):
    ana = await api_key(api.master, "renter", "ana")
    short_rsa = openssh_public(rsa.generate_private_key(public_exponent=65537, key_size=1024))
    for bad, says in [
        ("not a key", "public_key"),
        ("ssh-ed25519 !!!notbase64", "not a valid"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "not one of"),
        (short_rsa, "too short"),
    ]:
        answer = await api.post("/api/v1/ssh-keys", json={"public_key": bad}, headers=ana)
        assert answer.status == 400, bad
        error = (await answer.json())["error"]
        assert error["code"] == "invalid_ssh_key" and says in error["message"], error


async def test_an_ssh_tunnel_needs_a_key_of_the_caller_and_only_the_owner_reads_the_host_keys(api):
    ana = await api_key(api.master, "renter", "ana")
    bo = await api_key(api.master, "renter", "bo")
    workload = await submit(api, ana)
    opened = await api.post(f"/api/v1/workloads/{workload['id']}/tunnels", json={"kind": "ssh"}, headers=ana)
    assert opened.status == 409
    assert "has no SSH public keys" in (await opened.json())["error"]["message"]
    line = openssh_public(ed25519.Ed25519PrivateKey.generate(), "ana@laptop")
    assert (await api.post("/api/v1/ssh-keys", json={"public_key": line}, headers=ana)).status == 201
    queued = await api.post(f"/api/v1/workloads/{workload['id']}/tunnels", json={"kind": "ssh"}, headers=ana)
    assert queued.status == 409 and "runs nowhere yet" in (await queued.json())["error"]["message"]
    theirs = await api.post(f"/api/v1/workloads/{workload['id']}/tunnels", json={"kind": "ssh"}, headers=bo)
    assert theirs.status == 404

    hosts = await api.get(f"/api/v1/workloads/{workload['id']}/ssh", headers=ana)
    assert hosts.status == 200 and await hosts.json() == {"workload": workload["id"], "replicas": []}  # placed nowhere yet
    assert (await api.get(f"/api/v1/workloads/{workload['id']}/ssh", headers=bo)).status == 404
