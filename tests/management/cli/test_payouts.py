"""``idlegrid billing payout-account|payouts|payout-run|reconcile`` and ``idlegrid ledger --period`` against a real
Master paying providers through the fake of Stripe's Connect calls (tests/support/fake_connect.py)."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from management.cli import main as cli
from management.market.money import MICRO
from management.payments.payouts import period_label
from tests.management.hosts import api_key
from tests.management.payments.test_payout_runs import DAY, earn, paying_master
from tests.support.fake_connect import FakeConnect, fake_connect_server
from tests.support.operator_api import OperatorApi


@pytest.fixture
async def fake() -> AsyncIterator[FakeConnect]:
    async with fake_connect_server() as server:
        yield server


@pytest.fixture
async def paying(tmp_path: Path, fake: FakeConnect) -> AsyncIterator[OperatorApi]:
    async with paying_master(tmp_path / "master", fake) as api:
        yield api


async def key_file(api: OperatorApi, tmp_path: Path, role: str, account: str) -> Path:
    path = tmp_path / f"{account}.key"
    path.write_text((await api_key(api.master, role, account))["Authorization"].removeprefix("Bearer "))
    return path


async def run(api: OperatorApi, key: Path, *argv: str, capsys: pytest.CaptureFixture[str], head: int = 2) -> tuple[int, str]:
    capsys.readouterr()
    url = str(api.make_url("")).rstrip("/")
    command = [*argv[:head], "--api", url, "--key-file", str(key), *argv[head:]]
    code = await asyncio.to_thread(cli.main, command)
    out, err = capsys.readouterr()
    return code, out + err


async def test_a_provider_connects_and_is_paid_and_the_operator_reconciles_from_the_command_line(
    paying: OperatorApi, fake: FakeConnect, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    acme = await key_file(paying, tmp_path, "provider", "acme")
    operator = tmp_path / "operator.key"
    operator.write_text(paying.auth["Authorization"].removeprefix("Bearer "))

    code, out = await run(paying, acme, "billing", "payout-account", "--connect", capsys=capsys)
    assert code == 0, out
    assert "onboarding not finished" in out and f"onboard at: {fake.url}/onboarding/acct_" in out
    async with aiohttp.ClientSession() as session, session.get(out.split("onboard at: ")[1].split()[0]):
        pass  # the owner's browser finishes the onboarding
    await earn(paying, "acme", 30 * MICRO, 10 * DAY, "e-old")
    code, out = await run(paying, acme, "billing", "payout-account", capsys=capsys)
    assert code == 0 and "can take payouts" in out and "payable:   30.00 USD" in out, out

    code, out = await run(paying, acme, "billing", "payout-run", capsys=capsys)
    assert code != 0 and "403 forbidden" in out, out  # the operator's alone
    code, out = await run(paying, operator, "billing", "payout-run", capsys=capsys)
    assert code == 0 and "30.00 USD" in out and "paid" in out, out
    code, out = await run(paying, acme, "billing", "payouts", capsys=capsys)
    assert code == 0 and f"payout:acme:{period_label(time.time(), 'week')}" in out, out

    code, out = await run(paying, operator, "billing", "reconcile", capsys=capsys)
    assert code == 0 and "1 payouts in the ledger, 1 transfers on the payment provider: they agree" in out, out
    fake.plant_transfer(next(iter(fake.accounts)), 700)
    code, out = await run(paying, operator, "billing", "reconcile", capsys=capsys)
    assert code == 0 and "1 differences" in out and "unknown_transfer" in out and "7.00" in out, out


async def test_a_statement_of_one_month_as_csv_from_the_command_line(
    paying: OperatorApi, fake: FakeConnect, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    acme = await key_file(paying, tmp_path, "provider", "acme")
    await earn(paying, "acme", 30 * MICRO, 0, "e-now")
    month = period_label(time.time(), "month")

    code, out = await run(paying, acme, "ledger", "--csv", "--period", month, capsys=capsys, head=1)
    assert code == 0, out
    rows = list(csv.reader(io.StringIO(out)))
    assert [(r[2], r[3], r[7]) for r in rows[1:]] == [("charge", "e-now", "30.00")]
    code, out = await run(paying, acme, "ledger", "--csv", "--period", "1999-01", capsys=capsys, head=1)
    assert code == 0 and out.strip() == "seq,time,kind,key,rental,workload,memo,amount,balance", out
    code, out = await run(paying, acme, "ledger", "--period", "last-week", capsys=capsys, head=1)
    assert code != 0 and "period" in out, out
