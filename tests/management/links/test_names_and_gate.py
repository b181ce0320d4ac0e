"""The links' pure parts (management/links/names.py, gate.py): where a link lives, link tokens, who may pass."""

from __future__ import annotations

import msgspec
import pytest

from management.links.gate import Admitted, Refused, Visitor, admit
from management.links.names import (
    BadLinkToken,
    LinkAddress,
    check_token,
    from_host,
    from_path,
    link_url,
    mint_token,
    parse_name,
)
from master.records import Assignment, PortLink, WorkloadRecord, WorkloadSpec

KEY = b"k" * 32
LINK = LinkAddress("wl-00ab", 8888)


def workload(*links: PortLink, state: str = "running", assignment: str = "running") -> WorkloadRecord:
    ports = [link.port for link in links] or [8888]
    return WorkloadRecord(
        id="wl-00ab",
        account="alice",
        spec=WorkloadSpec(name="nb", image="img", ports=ports, links=list(links)),
        state=state,
        created_at=0.0,
        queued_at=0.0,
        assignments=[Assignment(replica=0, agent_id="agt-1", units=[], container="c", state=assignment)],
    )


def test_a_link_is_named_by_workload_and_port_in_a_path_or_on_the_wildcard_domain():
    assert parse_name("wl-00ab-8888") == LINK
    assert parse_name("wl-00ab-0") is None and parse_name("wl-00ab-70000") is None and parse_name("agt-1-80") is None
    assert from_path("/w/wl-00ab-8888/api/x") == (LINK, "/api/x")
    assert from_path("/w/wl-00ab-8888") == (LINK, "")
    assert from_path("/w/nope/") is None and from_path("/api/v1/workloads") is None
    assert from_host("WL-00AB-8888.Links.Example.net:443", "links.example.net") == LINK
    assert from_host("wl-00ab-8888.evil.net", "links.example.net") is None
    assert from_host("wl-00ab-8888.links.example.net", "") is None
    assert link_url(LINK, public_url="http://m:7000/", domain="", scheme="https") == "http://m:7000/w/wl-00ab-8888/"
    assert link_url(LINK, public_url="http://m:7000", domain="links.example.net", scheme="https") == (
        "https://wl-00ab-8888.links.example.net/"
    )


def test_a_link_token_opens_its_own_link_until_it_expires_and_nothing_else():
    token = mint_token(KEY, "alice", LINK, expires_at=1000)
    assert check_token(KEY, token, LINK, now=999) == "alice"
    with pytest.raises(BadLinkToken, match="expired"):
        check_token(KEY, token, LINK, now=1000)
    with pytest.raises(BadLinkToken, match="another link"):
        check_token(KEY, token, LinkAddress("wl-00ab", 8889), now=0)
    with pytest.raises(BadLinkToken, match="not one this grid issues"):
        check_token(b"x" * 32, token, LINK, now=0)  # another grid's key
    body, mac = token.removeprefix("igl_").split(".")
    forged = msgspec.json.encode(["mallory", "wl-00ab", 8888, 10**10])
    import base64

    tampered = "igl_" + base64.urlsafe_b64encode(forged).rstrip(b"=").decode() + "." + mac
    with pytest.raises(BadLinkToken):
        check_token(KEY, tampered, LINK, now=0)
    for junk in ("igl_", "igl_$$$.%%%", "igl_abc"):
        with pytest.raises(BadLinkToken):
            check_token(KEY, junk, LINK, now=0)


def test_a_private_link_lets_in_its_owner_and_the_operator_only():
    private = workload(PortLink(port=8888))
    assert admit(private, 8888, Visitor("alice", operator=False)) == Admitted(PortLink(port=8888), "owner")
    assert admit(private, 8888, Visitor("root", operator=True)) == Admitted(PortLink(port=8888), "operator")
    assert isinstance(refused := admit(private, 8888, None), Refused) and refused.status == 401
    other = admit(private, 8888, Visitor("bob", operator=False))
    missing = admit(None, 8888, Visitor("bob", operator=False))
    assert isinstance(other, Refused) and isinstance(missing, Refused)
    assert (other.status, missing.status) == (404, 404)
    assert "no link" in other.message and "no link" in missing.message


def test_a_public_link_lets_anyone_in_and_only_http_ports_that_are_declared_have_links():
    public = workload(PortLink(port=8888, public=True))
    assert admit(public, 8888, None) == Admitted(PortLink(port=8888, public=True), "public")
    tcp = workload(PortLink(port=8888, kind="tcp"))
    assert isinstance(refused := admit(tcp, 8888, Visitor("alice", operator=False)), Refused) and refused.status == 404
    assert isinstance(refused := admit(public, 9999, None), Refused) and refused.status == 404


def test_a_link_answers_503_until_a_replica_runs():
    queued = workload(PortLink(port=8888, public=True), state="queued", assignment="pending")
    refused = admit(queued, 8888, None)
    assert isinstance(refused, Refused) and refused.status == 503 and "queued" in refused.message


def test_the_spec_refuses_links_to_undeclared_ports_repeats_unknown_kinds_and_public_tcp():
    def spec(**fields):
        return msgspec.convert({"name": "nb", "image": "img", **fields}, WorkloadSpec)

    for fields, said in (
        ({"ports": [80], "links": [{"port": 81}]}, "ports does not declare"),
        ({"ports": [80], "links": [{"port": 80}, {"port": 80}]}, "more than once"),
        ({"ports": [80], "links": [{"port": 80, "kind": "udp"}]}, "not one of"),
        ({"ports": [80], "links": [{"port": 80, "kind": "tcp", "public": True}]}, "only an http port"),
    ):
        with pytest.raises(msgspec.ValidationError, match=said):
            spec(**fields)
    assert spec(ports=[80], links=[{"port": 80}]).links == [PortLink(port=80)]
