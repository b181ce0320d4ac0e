"""Webhooks reach public addresses only (D6: server-side request forgery), judged without connecting anywhere.

The refusals are checked by the pure functions (``ipaddress``, no socket), by a notifier whose target is a counting
black hole on 127.0.0.1 (no connection accepted: nothing was tried), and with a resolver injected for names that
must not be looked up for real. No test sends traffic to any address but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from management.monitoring.evaluator import FIRING, AlertTransition
from management.monitoring.notifier import NotifierSettings, Webhook, WebhookNotifier
from management.monitoring.webhook_targets import PublicResolver, TargetRefused, address_refusal, url_refusal
from master.config import MasterConfig
from tests.management.monitoring.receiver import BlackHole, WebhookReceiver

FAST = NotifierSettings(backoff_s=0.01, backoff_max_s=0.05, max_attempts=2, timeout_s=5.0)
ALLOWING = dataclasses.replace(FAST, allow_private=True)  # the operator's webhooks may reach private targets

REFUSED = [
    ("http://127.0.0.1:8080/x", "loopback"),
    ("http://[::1]/x", "loopback"),
    ("http://0.0.0.0/x", "unspecified"),
    ("http://[::]/x", "unspecified"),
    ("http://2130706433/x", "loopback"),  # 127.0.0.1, decimal
    ("http://127.1/x", "loopback"),  # 127.0.0.1, short
    ("http://0x7f.1/x", "loopback"),  # 127.0.0.1, hexadecimal
    ("http://0177.0.0.1/x", "loopback"),  # 127.0.0.1, octal
    ("http://[::ffff:127.0.0.1]/x", "loopback"),  # IPv4-mapped IPv6
    ("http://127.0.0.1./x", "loopback"),  # a trailing dot
    ("http://\u2460\u2461\u2466.0.0.1/x", "loopback"),  # circled digits: 127.0.0.1 once the name is normalized
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fe80::1]/x", "link-local"),
    ("http://10.0.0.5/x", "private"),
    ("http://172.16.3.4/x", "private"),
    ("http://192.168.1.1/x", "private"),
    ("http://[fd00::1]/x", "private"),
    ("http://100.64.0.1/x", "CGNAT"),  # shared address space (carrier-grade NAT)
    ("http://localhost:7000/api/v1/accounts", "localhost"),
    ("http://LOCALHOST./x", "localhost"),
    ("http://api.localhost/x", "localhost"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED, ids=[u for u, _ in REFUSED])
def test_a_webhook_to_a_target_that_is_not_public_is_refused_saying_why(url, why):
    refusal = url_refusal(url, allow_private=False)
    assert refusal is not None and why in refusal and "public addresses only" in refusal


def test_credentials_in_a_webhook_url_are_refused_even_for_the_operator():
    for allow_private in (False, True):
        refusal = url_refusal("https://user:pass@hooks.example.net/x", allow_private=allow_private)
        assert refusal is not None and "credentials" in refusal
    assert "credentials" in (url_refusal("https://token@hooks.example.net/x", allow_private=False) or "")


def test_public_targets_and_the_operators_private_ones_when_allowed_are_accepted_without_a_lookup():
    assert url_refusal("https://hooks.example.net/idlegrid", allow_private=False) is None  # judged at each connection
    assert url_refusal("https://8.8.8.8/x", allow_private=False) is None
    assert url_refusal("http://127.0.0.1:8080/x", allow_private=True) is None
    assert url_refusal("ftp://hooks.example.net/x", allow_private=True) is not None


def test_nat64_and_6to4_forms_are_judged_by_the_ipv4_address_they_carry():
    assert address_refusal(ipaddress.ip_address("64:ff9b::7f00:1")) is not None  # 127.0.0.1 through NAT64
    assert address_refusal(ipaddress.ip_address("2002:7f00:1::")) is not None  # 127.0.0.1 in 6to4
    assert address_refusal(ipaddress.ip_address("64:ff9b::808:808")) is None  # 8.8.8.8 through NAT64


class NamesResolver(AbstractResolver):
    """Answers from a table, without DNS: names that must not be looked up for real; counts its lookups."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.lookups = 0

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.lookups += 1
        address = self.table[host]
        return [ResolveResult(hostname=host, host=address, port=port, family=socket.AF_INET, proto=0, flags=0)]

    async def close(self) -> None:
        pass


async def test_the_public_resolver_refuses_a_name_with_any_address_that_is_not_public():
    resolver = PublicResolver(NamesResolver({"rebind.test": "127.0.0.1"}))
    with pytest.raises(TargetRefused, match=r"rebind.test resolves to 127.0.0.1: a loopback address"):
        await resolver.resolve("rebind.test", 80)


async def test_a_host_the_operator_allows_by_name_is_a_webhook_target_for_any_account_and_nothing_else_is():
    # The same egress_allow that lets renters name a private store or registry (common/egress.py).
    rule = MasterConfig(egress_allow=["hooks.lan", "127.0.0.1:9000"]).egress_rule()
    assert url_refusal("http://127.0.0.1:9000/x", allow_private=False, rule=rule) is None
    assert url_refusal("http://127.0.0.1:9001/x", allow_private=False, rule=rule) is not None
    names = NamesResolver({"hooks.lan": "10.0.0.7", "other.lan": "10.0.0.8"})
    resolver = PublicResolver(names, rule)
    assert [r["host"] for r in await resolver.resolve("hooks.lan", 443)] == ["10.0.0.7"]
    with pytest.raises(TargetRefused, match=r"other.lan resolves to 10.0.0.8: a private address"):
        await resolver.resolve("other.lan", 443)


def transition(provider: str = "prov-a") -> AlertTransition:
    return AlertTransition(
        key=f"gpu_overheating/GPU-0/100.000/firing/{provider}",
        rule="gpu_overheating",
        subject="GPU-0",
        phase=FIRING,
        at=100.0,
        since=0.0,
        fired_at=100.0,
        value=91.0,
        severity="critical",
        scope="gpu",
        summary="hot",
        labels={"provider": provider, "agent_id": "agt-a"},
    )


async def settled(notifier: WebhookNotifier, deliveries: int) -> None:
    async def done() -> None:
        while notifier.delivered + notifier.failed + notifier.withheld < deliveries:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), 10.0)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.1", "2130706433", "rebind.test"])
async def test_a_stored_webhook_to_loopback_is_refused_at_delivery_before_any_connection(host):
    """A webhook stored before targets were checked (or whose name now resolves to loopback: DNS rebinding): the
    delivery is refused, and the black hole on 127.0.0.1 accepts no connection. ``localhost`` goes through the
    system's resolver (it answers from /etc/hosts); ``rebind.test`` through an injected one."""
    hole = BlackHole()
    await hole.start()
    injected = NamesResolver({"rebind.test": "127.0.0.1"})
    notifier = WebhookNotifier(settings=FAST, resolver=(lambda: injected) if host == "rebind.test" else DefaultResolver)
    notifier.webhooks["p"] = Webhook(id="wh-p", url=hole.url(host), secret="s", owner="prov-a", role="provider")
    notifier.start()
    try:
        assert notifier.notify(transition()) == 1
        await settled(notifier, 1)
        assert (notifier.refused, notifier.delivered) == (1, 0)
        assert hole.accepted == 0
    finally:
        await notifier.stop()
        await hole.stop()


async def test_the_operators_webhook_reaches_a_private_target_only_with_the_setting_and_resolves_at_each_delivery():
    receiver = WebhookReceiver()
    await receiver.start()
    resolver = NamesResolver({"hooks.internal.test": "127.0.0.1"})
    url = f"http://hooks.internal.test:{receiver.port}/hook"
    ops = Webhook(id="wh-ops", url=url, secret="s", owner="operator", role="operator")
    closed = WebhookNotifier(settings=FAST, resolver=lambda: resolver)
    opened = WebhookNotifier(settings=ALLOWING, resolver=lambda: resolver)
    closed.webhooks["ops"] = opened.webhooks["ops"] = ops
    closed.start()
    opened.start()
    try:
        closed.notify(transition())
        await settled(closed, 1)
        assert closed.refused == 1 and receiver.requests == []
        opened.notify(transition("prov-1"))
        await settled(opened, 1)
        opened.notify(transition("prov-2"))
        await settled(opened, 2)
        assert opened.delivered == 2 and len(receiver.requests) == 2
        assert resolver.lookups == 3  # one refused, then one per delivery: nothing cached between connections
    finally:
        await closed.stop()
        await opened.stop()
        await receiver.stop()


@pytest.mark.parametrize("status", [307, 303, 302, 301, 308])
async def test_a_receiver_that_answers_with_a_redirect_is_not_followed(status):
    receiver = WebhookReceiver(statuses=[status])
    await receiver.start()
    notifier = WebhookNotifier(settings=ALLOWING)  # the receiver is on 127.0.0.1: the operator's setting allows it
    notifier.webhooks["ops"] = Webhook(id="wh-ops", url=receiver.url, secret="s", owner="operator", role="operator")
    notifier.start()
    try:
        notifier.notify(transition())
        await settled(notifier, 1)
        await asyncio.sleep(0.1)  # room for a wrong follow-up request to show up
        assert len(receiver.requests) == 1 and receiver.followed == []
        assert (notifier.delivered, notifier.failed) == (0, 1)  # a redirect is an answer, not a delivery; not retried
    finally:
        await notifier.stop()
        await receiver.stop()
