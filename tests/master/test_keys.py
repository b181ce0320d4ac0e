"""The Master's command-signing keys: rotation, retirement, persistence, and what agents are told."""

import time
from pathlib import Path

import pytest

from common.containers import DeleteSpec
from common.errors import Conflict, IdlegridError, NotFound, PKIError, SignatureError
from common.pki import (
    CertificateAuthority,
    CertRole,
    CommandSigner,
    CommandVerifier,
    generate_key,
    identity_of,
    load_cert,
    make_csr,
    verify_key_endorsement,
)
from common.wire import CommandBody, signing_bytes
from master.config import MasterConfig
from master.keys import FIRST_KEY_FILE, RING_FILE, KeyState, SigningKeyRing
from master.master import Master
from master.records import AgentRecord
from master.renewal import renew_certificate


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


def test_an_existing_signing_key_becomes_the_first_current_key(tmp_path: Path, ca):
    existing = CommandSigner.load_or_create(tmp_path / FIRST_KEY_FILE)
    ring = SigningKeyRing.open(tmp_path, ca)
    assert ring.current.key_id == existing.key_id
    assert [k.state for k in ring.describe()] == [KeyState.CURRENT]
    assert (tmp_path / RING_FILE).exists()


def test_rotation_makes_a_new_current_key_and_the_old_one_keeps_verifying(tmp_path: Path, ca):
    ring = SigningKeyRing.open(tmp_path, ca)
    old = ring.current.key_id
    new = ring.rotate()
    assert new.state is KeyState.CURRENT and ring.current.key_id == new.key_id != old
    assert ring.info(old).state is KeyState.VERIFYING
    assert set(ring.command_keys()) == {old, new.key_id}
    assert (tmp_path / "signing-keys" / f"{new.key_id}.key").stat().st_mode & 0o777 == 0o600
    for key_id, public in ring.command_keys().items():
        verify_key_endorsement(ca.cert, public, ring.key_endorsements()[key_id])


def test_a_retired_key_is_announced_as_retired_and_no_longer_offered(tmp_path: Path, ca):
    ring = SigningKeyRing.open(tmp_path, ca)
    old = ring.current.key_id
    ring.rotate()
    retired = ring.retire(old)
    assert retired.state is KeyState.RETIRED and retired.retired_at is not None
    assert old not in ring.command_keys() and old not in ring.key_endorsements()
    assert ring.retired_keys() == [old]
    assert ring.retire(old).retired_at == retired.retired_at  # retiring twice changes nothing


def test_the_current_key_cannot_be_retired_and_unknown_keys_are_not_found(tmp_path: Path, ca):
    ring = SigningKeyRing.open(tmp_path, ca)
    with pytest.raises(Conflict, match="rotate to a new key first"):
        ring.retire(ring.current.key_id)
    with pytest.raises(NotFound):
        ring.retire("0123456789abcdef")


def test_keys_and_their_states_survive_a_restart(tmp_path: Path, ca):
    ring = SigningKeyRing.open(tmp_path, ca)
    first = ring.current.key_id
    second = ring.rotate().key_id
    third = ring.rotate().key_id
    ring.retire(first)
    reopened = SigningKeyRing.open(tmp_path, ca)
    assert reopened.current.key_id == third
    assert {k.key_id: k.state for k in reopened.describe()} == {
        first: KeyState.RETIRED,
        second: KeyState.VERIFYING,
        third: KeyState.CURRENT,
    }
    body = b"same key, same signature"
    verifier = CommandVerifier(reopened.command_keys())
    verifier.verify(second, body, ring.signer(second).sign(body))


def test_a_missing_key_file_is_reported_not_replaced(tmp_path: Path, ca):
    ring = SigningKeyRing.open(tmp_path, ca)
    new = ring.rotate()
    (tmp_path / "signing-keys" / f"{new.key_id}.key").unlink()
    with pytest.raises(PKIError, match=f"{new.key_id} is missing"):
        SigningKeyRing.open(tmp_path, ca)


# --- the Master: signing with the ring, re-signing, the operator endpoints ------------------------


async def add_agent(master: Master, agent_id: str) -> None:
    agent = AgentRecord(id=agent_id, provider="prov", state="enrolled", enrolled_at=time.time())
    await master.store.agents.put(agent)
    await master.registry.add(agent)


def verifies(record, public_keys: dict[str, str]) -> bool:
    body = CommandBody(
        id=record.id,
        agent_id=record.agent_id,
        kind=record.kind,
        spec=record.spec,
        issued_at=record.created_at,
        deadline=record.deadline,
        key_id=record.key_id,
    )
    try:
        CommandVerifier(public_keys).verify(record.key_id, signing_bytes(body), record.signature)
    except SignatureError:
        return False
    return True


async def test_operators_rotate_list_and_retire_keys_through_the_api(api):
    listed = (await (await api.get("/api/v1/signing-keys", headers=api.auth)).json())["items"]
    assert [k["state"] for k in listed] == ["current"]
    old = listed[0]["key_id"]

    rotated = await api.post("/api/v1/signing-keys/rotate", headers=api.auth)
    assert rotated.status == 201
    new = (await rotated.json())["key_id"]
    listed = (await (await api.get("/api/v1/signing-keys", headers=api.auth)).json())["items"]
    assert {k["key_id"]: k["state"] for k in listed} == {new: "current", old: "verifying"}

    refused = await api.post(f"/api/v1/signing-keys/{new}/retire", headers=api.auth)
    assert refused.status == 409
    assert (await api.post("/api/v1/signing-keys/ffffffffffffffff/retire", headers=api.auth)).status == 404
    retired = await api.post(f"/api/v1/signing-keys/{old}/retire", headers=api.auth)
    assert retired.status == 200 and (await retired.json())["state"] == "retired"
    assert (await api.post("/api/v1/signing-keys/rotate")).status == 401


async def test_new_commands_are_signed_with_the_current_key_and_open_ones_re_signed_when_theirs_retires(api):
    master = api.master
    await add_agent(master, "agt-a")
    before = await master.commands.create("agt-a", DeleteSpec(name="x"))  # pending: agent not connected
    old = before.key_id
    new = (await master.rotate_signing_key()).key_id
    after = await master.commands.create("agt-a", DeleteSpec(name="y"))
    assert after.key_id == new and before.key_id == old  # rotation alone re-signs nothing

    await master.retire_signing_key(old)
    stored = await master.store.commands.get(before.id)
    assert stored.key_id == new
    assert verifies(stored, master.authority.command_keys())
    resigned = await master.store.events.list(subject=before.id, kind_prefix="command.resigned", after_seq=0, limit=10)
    assert resigned and resigned[0].data["old_key"] == old


async def test_keys_rotated_and_retired_survive_a_master_restart(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    master = Master(config)
    await master.start()
    old = master.authority.signer.key_id
    new = (await master.rotate_signing_key()).key_id
    await master.retire_signing_key(old)
    await master.stop()

    again = Master(config)
    await again.start()
    try:
        assert again.authority.signer.key_id == new
        assert again.authority.keys.retired_keys() == [old]
        assert list(again.authority.command_keys()) == [new]
    finally:
        await again.stop()


# --- agent certificates the Master renews --------------------------------------------------------


def renew(master: Master, agent: AgentRecord, csr_pem: str, now: float) -> str:
    config = master.config
    return renew_certificate(
        master.authority.ca, agent, csr_pem, now, min_interval_s=config.renew_min_interval_s, valid_s=config.agent_cert_s
    )


async def test_a_renewal_names_the_agent_keeps_the_old_serial_for_revocation_and_is_spaced_out(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, agent_cert_s=100.0))
    await master.start()
    try:
        await add_agent(master, "agt-a")
        agent = master.registry.get("agt-a")
        first = master.authority.ca.issue(CertRole.AGENT, "agt-a", generate_key().public_key(), valid_s=100)
        agent.cert_serial, agent.cert_not_after = format(first.serial_number, "x"), first.not_valid_after_utc.timestamp()

        now = time.time()
        cert_pem = renew(master, agent, make_csr(generate_key(), "agt-someone-else").decode(), now)
        renewed = identity_of(load_cert(cert_pem.encode()))
        assert renewed.id == "agt-a" and agent.cert_serial == renewed.serial
        assert list(agent.previous_serials) == [format(first.serial_number, "x")]

        with pytest.raises(IdlegridError, match="ask again"):  # at most one per agent_cert_s / 10 here
            renew(master, agent, make_csr(generate_key(), "agt-a").decode(), now + 1)

        await master.revoke("agt-a")
        assert {format(first.serial_number, "x"), renewed.serial} <= set(master.channel.revoked)
    finally:
        await master.stop()
