"""The tunnel ticket and frames (common/tunnel.py): what a relay and an agent accept, and the frame codec."""

from __future__ import annotations

import msgspec
import pytest

from common.errors import ProtocolError
from common.pki import CertificateAuthority, CommandSigner, CommandVerifier
from common.tunnel import (
    HEADER,
    MAX_TUNNEL_PAYLOAD,
    Op,
    Ticket,
    TicketBody,
    TicketRefused,
    chunks,
    decode_exit,
    decode_frame,
    decode_resize,
    decode_ticket,
    encode_frame,
    encode_ticket,
    exit_payload,
    new_ticket_id,
    resize_payload,
    sign_ticket,
    ticket_signing_bytes,
    verify_at_agent,
    verify_at_relay,
)

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture(scope="module")
def signer() -> CommandSigner:
    return CommandSigner.generate()


def body(signer: CommandSigner, **changes: object) -> TicketBody:
    fields = {
        "id": new_ticket_id(),
        "kind": "exec",
        "account": "alice",
        "workload": "wl-1",
        "agent_id": "agt-1",
        "container": "wl-1-0",
        "relay_id": "relay-1",
        "issued_at": NOW,
        "expires_at": NOW + 30,
        "key_id": signer.key_id,
        "command": ["bash"],
        "tty": True,
    }
    return TicketBody(**(fields | changes))  # type: ignore[arg-type]


def ticket(ca: CertificateAuthority, signer: CommandSigner, **changes: object) -> Ticket:
    return sign_ticket(body(signer, **changes), signer, ca.endorse_command_key(signer.public_key_b64()))


def test_a_relay_and_an_agent_accept_a_ticket_the_master_signed(ca, signer):
    t = decode_ticket(encode_ticket(ticket(ca, signer)))
    verify_at_relay(t, ca.cert, "relay-1", NOW + 1)
    verify_at_agent(t, CommandVerifier({signer.key_id: signer.public_key_b64()}), "agt-1", NOW + 1)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"relay_id": "relay-2"}, "is for relay 'relay-2'"),
        ({"expires_at": NOW - 5}, "expired"),
    ],
)
def test_a_relay_refuses_a_ticket_for_another_relay_or_expired(ca, signer, change, why):
    with pytest.raises(TicketRefused, match=why):
        verify_at_relay(ticket(ca, signer, **change), ca.cert, "relay-1", NOW)


def test_a_relay_refuses_an_altered_ticket_and_a_key_the_platform_ca_did_not_endorse(ca, signer):
    good = ticket(ca, signer)
    altered = msgspec.structs.replace(good, body=msgspec.structs.replace(good.body, workload="wl-other"))
    with pytest.raises(TicketRefused, match="does not verify"):
        verify_at_relay(altered, ca.cert, "relay-1", NOW)
    rogue = CommandSigner.generate()
    other_ca = CertificateAuthority.create()
    forged = sign_ticket(body(rogue), rogue, other_ca.endorse_command_key(rogue.public_key_b64()))
    with pytest.raises(TicketRefused, match="not endorsed by the platform CA"):
        verify_at_relay(forged, ca.cert, "relay-1", NOW)


def test_an_agent_refuses_a_ticket_for_another_agent_or_signed_by_a_key_it_does_not_trust(ca, signer):
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    with pytest.raises(TicketRefused, match="is for agent 'agt-1', not 'agt-2'"):
        verify_at_agent(ticket(ca, signer), verifier, "agt-2", NOW)
    rogue = CommandSigner.generate()
    endorsed_elsewhere = sign_ticket(body(rogue), rogue, ca.endorse_command_key(rogue.public_key_b64()))
    with pytest.raises(TicketRefused, match="unknown signing key"):
        verify_at_agent(endorsed_elsewhere, verifier, "agt-1", NOW)


def test_a_ticket_signature_never_passes_for_a_command_signature(signer):
    # The signed bytes carry a prefix of their own: a command body and a ticket body can never share a signature.
    assert ticket_signing_bytes(body(signer)).startswith(b"idlegrid tunnel ticket\0")


@pytest.mark.parametrize("text", ["", "!!!", "a" * 9000, "e30=", "eyJib2R5Ijp7fX0="])
def test_garbage_in_the_ticket_header_is_refused_with_a_reason(text):
    with pytest.raises(TicketRefused):
        decode_ticket(text)


def test_an_unknown_kind_is_refused(ca, signer):
    with pytest.raises(TicketRefused, match="unknown tunnel kind"):
        decode_ticket(encode_ticket(ticket(ca, signer, kind="teleport")))


def test_frames_round_trip_and_bad_ones_are_protocol_errors():
    frame = decode_frame(encode_frame(Op.DATA, 7, b"hello"))
    assert (frame.op, frame.stream, frame.payload) == (Op.DATA, 7, b"hello")
    size = decode_resize(decode_frame(encode_frame(Op.RESIZE, 0, resize_payload(120, 40))).payload)
    assert (size.cols, size.rows) == (120, 40)
    assert decode_exit(exit_payload(3)).code == 3
    with pytest.raises(ProtocolError, match="shorter than"):
        decode_frame(b"\x01\x00")
    with pytest.raises(ProtocolError, match="unknown tunnel op 99"):
        decode_frame(HEADER.pack(99, 0))
    with pytest.raises(ProtocolError, match="over"):
        decode_frame(HEADER.pack(1, 0) + b"x" * (MAX_TUNNEL_PAYLOAD + 1))
    with pytest.raises(ValueError):
        encode_frame(Op.DATA, 0, b"x" * (MAX_TUNNEL_PAYLOAD + 1))


def test_chunks_cut_data_into_payloads_a_frame_can_carry():
    data = b"x" * (2 * MAX_TUNNEL_PAYLOAD + 5)
    parts = chunks(data)
    assert [len(p) for p in parts] == [MAX_TUNNEL_PAYLOAD, MAX_TUNNEL_PAYLOAD, 5] and b"".join(parts) == data
