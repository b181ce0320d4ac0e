"""The one egress rule (common/egress.py), judged without connecting anywhere: literal forms, names that always mean
this host, a fake resolver for names, and the allowlist's shape. No test here opens a socket."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.egress import EgressRule, address_refusal, host_refusal, literal_address, parse_allowed, registry_target
from common.errors import ConfigError, EgressRefused, is_renter_fault


def resolving(table: dict[str, list[str]]):  # noqa: ANN201
    """A resolver that answers from ``table`` and never asks DNS; it records what it was asked."""
    asked: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "not in the test's table")
        return table[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


LOOPBACK_FORMS = ["127.0.0.1", "127.1", "2130706433", "0x7f.1", "0x7f000001", "0177.0.0.1", "127.0.0.1.", "[::1]", "::1"]
MAPPED = ["::ffff:127.0.0.1", "[::ffff:7f00:1]", "64:ff9b::7f00:1", "2002:7f00:1::"]


@pytest.mark.parametrize("host", LOOPBACK_FORMS + MAPPED + ["localhost", "LOCALHOST.", "db.localhost"])
def test_every_written_form_of_this_host_is_refused_without_dns(host):
    why = host_refusal(host)
    assert why is not None and ("loopback" in why or "localhost" in why)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("224.0.0.1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
    ],
)
def test_addresses_that_are_not_public_are_refused_saying_what_they_are(address, why):
    refusal = address_refusal(ipaddress.ip_address(address))
    assert refusal is not None and why in refusal


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_decimal_or_hex_written_ipv4_address_is_judged_as_the_address_it_stands_for(number):
    address = ipaddress.IPv4Address(number)
    for written in (str(number), hex(number)):
        assert literal_address(written) == address
        assert (host_refusal(written) is None) == (address_refusal(address) is None)


@given(st.ip_addresses(v=4))
def test_an_ipv4_mapped_address_is_judged_as_the_ipv4_address_it_carries(address):
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert (address_refusal(mapped) is None) == (address_refusal(address) is None)


def test_a_name_is_refused_when_any_address_it_resolves_to_is_not_public_before_anything_connects():
    resolver = resolving({"store.example": ["93.184.216.34", "10.0.0.1"]})
    rule = EgressRule(resolver=resolver)
    with pytest.raises(EgressRefused, match=r"store.example resolves to 10.0.0.1: a private address") as refused:
        rule.addresses("storage endpoint", "store.example", 443)
    assert "egress_allow in the agent's config" in str(refused.value)  # what the renter can ask for
    assert is_renter_fault(refused.value.code) and refused.value.code == "egress_refused"  # the host is not blamed


def test_a_public_name_gives_the_addresses_to_connect_to_and_a_literal_is_never_looked_up():
    resolver = resolving({"store.example": ["93.184.216.34"]})
    rule = EgressRule(resolver=resolver)
    assert rule.addresses("storage endpoint", "store.example", 443) == [ipaddress.ip_address("93.184.216.34")]
    with pytest.raises(EgressRefused):
        rule.addresses("storage endpoint", "2130706433", 443)
    assert resolver.asked == [("store.example", 443)]


def test_the_provider_allows_a_private_endpoint_by_name_and_port_and_nothing_else():
    resolver = resolving({"minio.lan": ["192.168.1.20"], "other.lan": ["192.168.1.21"]})
    rule = EgressRule.allowing(["minio.lan:9000", "registry.lan", "127.0.0.1:5000"], resolver=resolver)
    assert rule.addresses("storage endpoint", "minio.lan", 9000) == [ipaddress.ip_address("192.168.1.20")]
    assert rule.allows("MINIO.lan.", 9000)  # case and a trailing dot aside
    assert rule.refusal_before_dns("registry", "registry.lan", 1234) is None  # no port: every port
    assert rule.addresses("registry", "127.0.0.1", 5000) == [ipaddress.ip_address("127.0.0.1")]
    with pytest.raises(EgressRefused):
        rule.addresses("storage endpoint", "minio.lan", 9001)  # another port of an allowed name
    with pytest.raises(EgressRefused):
        rule.addresses("storage endpoint", "other.lan", 9000)
    with pytest.raises(EgressRefused):
        rule.addresses("registry", "127.1", 5000)  # the same address written another way is not the allowed name


@pytest.mark.parametrize("entry", ["", "minio.lan:port", "minio.lan:0", "minio.lan:70000", "http://minio.lan", "a b", "[::1"])
def test_an_allowlist_entry_that_is_not_host_or_host_port_is_a_config_error_naming_it(entry):
    with pytest.raises(ConfigError, match="egress_allow"):
        parse_allowed(entry)


@pytest.mark.parametrize(
    ("reference", "target"),
    [
        ("busybox", None),
        ("docker.io/library/busybox:1", None),
        ("ghcr.io/acme/app:1", ("ghcr.io", 443)),
        ("127.0.0.1:5000/tools/busy:1", ("127.0.0.1", 5000)),
        ("localhost/app", ("localhost", 443)),
        ("[::1]:5000/app@sha256:00", ("::1", 5000)),
    ],
)
def test_the_registry_an_image_is_pulled_from_is_where_the_rule_looks(reference, target):
    assert registry_target(reference) == target
