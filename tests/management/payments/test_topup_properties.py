"""The top-up service's promises, as properties over a real Master (SQLite) and the real Stripe adapter: ANY sequence
of top-ups opened, the provider's events about them (paid, failed, in another currency, forged), each delivered
any number of times, and Master restarts, keeps the ledger's sum at zero, credits each top-up at most once and exactly
its amount, and acts on each event once: a delivery seen before (by its id, across restarts) answers ``replayed`` and
moves nothing. Deliveries are signed as Stripe signs them (t=<time>,v1=HMAC-SHA256 of "<time>.<body>" with the
endpoint's secret), so ``stripe.Webhook.construct_event`` checks every one, and a forged one is refused whole.

Each example runs its own Master in a fresh directory: the dedupe must hold in the store, not in a process's memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from management.http.keys import SERVICES_KEY
from management.market.ledger import renter_account
from management.payments.provider import InvalidWebhook
from management.payments.records import TopupRecord
from management.payments.topups import topup_key
from management.store import topup_repo
from master.config import MasterConfig
from master.port import AccountRole
from tests.support.operator_api import OperatorApi, operator_api

SECRET = "whsec_properties"

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("topup"), st.integers(1, 100_000)),  # cents
        # event number (small: the same event again), which top-up, paid or failed, in the grid's currency or not
        st.tuples(st.just("deliver"), st.integers(0, 5), st.integers(0, 3), st.booleans(), st.booleans()),
        st.tuples(st.just("forge"), st.integers(0, 5)),
        st.tuples(st.just("restart")),
    ),
    max_size=14,
)


def signed(body: bytes) -> str:
    at = int(time.time())
    return f"t={at},v1={hmac.new(SECRET.encode(), f'{at}.'.encode() + body, hashlib.sha256).hexdigest()}"


def stripe_event(number: int, topup: TopupRecord, paid: bool, in_usd: bool) -> bytes:
    intent = {
        "id": topup.reference,
        "object": "payment_intent",
        "amount": topup.amount // 10_000,
        "amount_received": topup.amount // 10_000 if paid else 0,
        "currency": "usd" if in_usd else "eur",
        "metadata": {"idlegrid_topup": topup.id, "idlegrid_account": topup.account},
        "last_payment_error": None if paid else {"message": "Your card was declined.", "code": "card_declined"},
    }
    kind = "payment_intent.succeeded" if paid else "payment_intent.payment_failed"
    return json.dumps({"id": f"evt_{number}", "object": "event", "type": kind, "data": {"object": intent}}).encode()


@dataclass
class Model:
    """What the properties expect: the first outcome of each event, and each top-up's one credit."""

    topups: list[TopupRecord] = field(default_factory=list)
    bodies: dict[int, bytes] = field(default_factory=dict)  # event number -> the body as first sent
    outcomes: dict[int, str] = field(default_factory=dict)
    credited: dict[str, int] = field(default_factory=dict)


async def check(api: OperatorApi, model: Model) -> None:
    ledger = api.app[SERVICES_KEY].market.market.ledger
    await ledger.load()  # from the store, not from what this process posted
    assert sum(ledger.balances().values()) == 0
    assert ledger.balance(renter_account("ann")) == sum(model.credited.values())
    entries = await ledger.entries([renter_account("ann")])
    assert sorted(e.key for e in entries) == sorted(topup_key(t) for t in model.credited)


async def scenario(ops: list[tuple[Any, ...]], state: Path) -> None:
    config = MasterConfig(
        state_dir=str(state), link_port=0, payment_provider="stripe", stripe_api_key="sk_test_x", stripe_webhook_secret=SECRET
    )
    model, counter = Model(), itertools.count()
    api_cm = operator_api(config)
    api = await api_cm.__aenter__()
    try:
        await api.master.accounts.ensure("ann", AccountRole.RENTER)
        for op in ops:
            topups = api.app[SERVICES_KEY].topups
            if op[0] == "topup":
                n = next(counter)
                rec = TopupRecord(
                    id=f"tu-{n}", account="ann", amount=int(op[1]) * 10_000, currency="USD", provider="stripe",
                    reference=f"pi_{n}", created_at=time.time(),
                )  # fmt: skip
                await topup_repo(api.master.store).put(rec)  # as create stores it once Stripe answered
                model.topups.append(rec)
            elif op[0] == "deliver" and model.topups:
                _, number, pick, paid, in_usd = op
                assert isinstance(number, int) and isinstance(pick, int)
                first = number not in model.bodies
                if first:
                    topup = model.topups[pick % len(model.topups)]
                    model.bodies[number] = stripe_event(number, topup, bool(paid), bool(in_usd))
                body = model.bodies[number]
                receipt = await topups.receive(body, signed(body))
                assert receipt.replayed is not first
                if first:
                    model.outcomes[number] = receipt.outcome
                    event = json.loads(body)
                    topup_id = event["data"]["object"]["metadata"]["idlegrid_topup"]
                    amount = next(t.amount for t in model.topups if t.id == topup_id)
                    if event["type"] == "payment_intent.succeeded" and event["data"]["object"]["currency"] == "usd":
                        assert receipt.outcome == "credited"
                        model.credited.setdefault(topup_id, amount)
                    else:
                        assert receipt.outcome in ("failed", "ignored", "refused")
                assert receipt.outcome == model.outcomes[number]
            elif op[0] == "forge" and model.bodies:
                number = int(op[1]) % len(model.bodies)
                body = sorted(model.bodies.items())[number][1]
                forged = body.replace(b'"amount_received": ', b'"amount_received": 9')
                with pytest.raises(InvalidWebhook):
                    await topups.receive(forged, signed(body))
            elif op[0] == "restart":
                await api_cm.__aexit__(None, None, None)
                api_cm = operator_api(config)
                api = await api_cm.__aenter__()
            await check(api, model)
    finally:
        await api_cm.__aexit__(None, None, None)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(OPS)
def test_any_deliveries_and_restarts_credit_each_topup_once_and_each_event_once(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="idlegrid-topups-") as state:
        asyncio.run(scenario(ops, Path(state) / "master"))
