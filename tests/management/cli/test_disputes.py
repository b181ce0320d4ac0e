"""``idlegrid dispute ...`` against a real Master's API: a renter opens a dispute of its ended rental, its host's provider
answers, the operator resolves it with a partial refund, and a refused command says why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from management.cli import main as cli
from tests.management.hosts import add_agent, api_key
from tests.management.payments.test_api_disputes import ended_rental
from tests.support.operator_api import OperatorApi


async def key_file(tmp_path: Path, headers: dict[str, str], name: str) -> Path:
    path = tmp_path / f"{name}.key"
    path.write_text(headers["Authorization"].removeprefix("Bearer "))
    return path


async def run(api: OperatorApi, key: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    url = str(api.make_url("")).rstrip("/")
    code = await asyncio.to_thread(cli.main, [*argv, "--api", url, "--key-file", str(key)])
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_dispute_is_opened_answered_and_resolved_from_the_command_line(
    api: OperatorApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await add_agent(api.master, "agt-a1", "a10:1", provider="acme", runtime="docker", isolation="container")
    lab = await key_file(tmp_path, await api_key(api.master, "renter", "lab"), "lab")
    acme = await key_file(tmp_path, await api_key(api.master, "provider", "acme"), "acme")
    operator = await key_file(tmp_path, api.auth, "operator")
    assert (await api.post("/api/v1/accounts/lab/credit", json={"amount": "100"}, headers=api.auth)).status == 201
    rental = await ended_rental(api, 1, ended_ago=60)

    code, out, err = await run(api, lab, "dispute", "open", "--rental", rental, "--reason", "it hung", capsys=capsys)
    assert code == 0, err
    assert f"of rental {rental} on agt-a1 (acme): open" in out and "held from the provider: 2.25" in out
    dispute_id = out.split()[1]
    code, out, err = await run(api, acme, "dispute", "answer", dispute_id, "--text", "the job hung itself", capsys=capsys)
    assert code == 0 and "answer:     the job hung itself" in out, err
    code, out, err = await run(api, lab, "dispute", "resolve", dispute_id, "--partial", "1", capsys=capsys)
    assert code != 0 and "forbidden" in err.lower(), out + err  # a renter resolves nothing
    code, out, err = await run(
        api, operator, "dispute", "resolve", dispute_id, "--partial", "1", "--note", "both at fault", capsys=capsys
    )
    assert code == 0, err
    assert "resolved:   partial by operator" in out and "1.00 refunded, 1.25 released to the provider; both at fault" in out
    code, out, err = await run(api, lab, "dispute", "list", capsys=capsys)
    assert code == 0 and [line.split()[:5] for line in out.splitlines()[1:]] == [
        [dispute_id, rental, "agt-a1", "lab", "resolved"]
    ]
    code, out, err = await run(api, operator, "dispute", "resolve", dispute_id, "--none", capsys=capsys)
    assert code != 0 and "already resolved (partial)" in err
