"""``idlegrid billing topup`` and ``billing topups`` against a real Master's API taking payments through localstripe:
the command opens the top-up and prints where to pay it; once paid (Stripe's test payment method, as a browser pays
on Stripe's element) and the signed webhook delivered, ``balance`` shows the money."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from management.cli import main as cli
from tests.management.hosts import api_key
from tests.management.payments.test_api_topups import SECRET, WEBHOOK, paying_config
from tests.support.localstripe import LocalStripe
from tests.support.operator_api import OperatorApi, operator_api


@pytest.fixture
async def paying(tmp_path: Path, localstripe: LocalStripe) -> AsyncIterator[OperatorApi]:
    async with operator_api(paying_config(tmp_path / "master", localstripe)) as api:
        await localstripe.send_webhooks_to(str(api.make_url(WEBHOOK)), SECRET)
        yield api


async def run(api: OperatorApi, key_file: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    url = str(api.make_url("")).rstrip("/")
    command = [*argv[:2], "--api", url, "--key-file", str(key_file), *argv[2:]]
    code = await asyncio.to_thread(cli.main, command)
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_renter_tops_up_from_the_command_line(
    paying: OperatorApi, localstripe: LocalStripe, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "ann.key"
    key_file.write_text((await api_key(paying.master, "renter", "ann"))["Authorization"].removeprefix("Bearer "))
    code, out, err = await run(paying, key_file, "billing", "topup", "--amount", "25.50", capsys=capsys)
    assert code == 0, err
    assert "of 25.50 USD opened (pending)" in out and "client secret: pi_" in out
    reference = out.split("client secret: ")[1].split("_secret_")[0]

    await localstripe.pay(reference)
    deadline = time.monotonic() + 20
    while True:
        code, out, err = await run(paying, key_file, "balance", "--json", capsys=capsys)
        if '"available": "25.50"' in out:
            break
        assert time.monotonic() < deadline, out + err
        await asyncio.sleep(0.1)
    code, out, err = await run(paying, key_file, "billing", "topups", capsys=capsys)
    assert code == 0, err
    assert [line.split()[2:5] for line in out.splitlines()[1:]] == [["25.50", "USD", "credited"]]


async def test_a_negative_or_huge_amount_is_refused_with_the_reason(
    paying: OperatorApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "ann.key"
    key_file.write_text((await api_key(paying.master, "renter", "ann"))["Authorization"].removeprefix("Bearer "))
    code, _, err = await run(paying, key_file, "billing", "topup", "--amount=-5", capsys=capsys)
    assert code != 0 and "more than 0" in err
    code, _, err = await run(paying, key_file, "billing", "topup", "--amount", "100000", capsys=capsys)
    assert code != 0 and "at most 500.00" in err


async def test_a_renter_saves_a_payment_method_and_sets_auto_topup_from_the_command_line(
    paying: OperatorApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "ann.key"
    key_file.write_text((await api_key(paying.master, "renter", "ann"))["Authorization"].removeprefix("Bearer "))
    code, out, err = await run(paying, key_file, "billing", "settings", capsys=capsys)
    assert code == 0 and "payment method:  none saved" in out and "auto top-up:     off" in out, out + err
    code, out, err = await run(paying, key_file, "billing", "auto-topup", "--threshold", "10", "--amount", "20", capsys=capsys)
    assert code != 0 and "no saved payment method" in err
    code, out, err = await run(paying, key_file, "billing", "payment-method", "--token", "pm_card_visa", capsys=capsys)
    assert code == 0 and "payment method:  none saved" not in out, out + err
    code, out, err = await run(paying, key_file, "billing", "auto-topup", "--threshold", "10", "--amount", "20", capsys=capsys)
    assert code == 0, err
    assert "auto top-up:     20.00 USD when the balance falls below 10.00 USD (at most hourly)" in out
    code, out, err = await run(paying, key_file, "billing", "auto-topup", "--threshold", "10", "--amount=-20", capsys=capsys)
    assert code != 0 and "more than 0" in err
    code, out, err = await run(paying, key_file, "billing", "auto-topup", "--off", capsys=capsys)
    assert code == 0 and "auto top-up:     off" in out, err


async def test_a_renter_sets_and_removes_spend_caps_from_the_command_line(
    paying: OperatorApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "ann.key"
    key_file.write_text((await api_key(paying.master, "renter", "ann"))["Authorization"].removeprefix("Bearer "))
    code, out, err = await run(
        paying, key_file, "billing", "caps", "--cap", "hour:5", "--cap", "project=train:month:100:hard", capsys=capsys
    )
    assert code == 0, err
    assert "cap:             5.00 USD per hour, account, soft (alert)" in out
    assert "cap:             100.00 USD per month, project train, hard (work stopped)" in out
    code, out, err = await run(paying, key_file, "billing", "caps", "--cap", "hour:-5", capsys=capsys)
    assert code != 0 and "more than 0" in err
    code, out, err = await run(paying, key_file, "billing", "caps", "--cap", "week:5", capsys=capsys)
    assert code != 0 and "is not [project=NAME:]hour|month:LIMIT[:hard]" in err
    code, out, err = await run(paying, key_file, "billing", "caps", "--none", capsys=capsys)
    assert code == 0 and "cap:" not in out, err
