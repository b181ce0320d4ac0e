"""The console over plain HTTP (aiohttp's test client on the app the Master serves), for tests that need no browser:
a renter ``rita`` with a console password, and signing in through the form as a browser would (CSRF token, Origin)."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from management.app import api_app
from master.config import ConsoleSettings, MasterConfig
from master.master import Master
from master.records import AccountRecord

PASSWORD = "renter-password-1"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class Console(TestClient[web.Request, web.Application]):
    master: Master
    origin: str


async def console_for(tmp_path: Path, **settings: object) -> Console:
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, console=ConsoleSettings(**settings)))  # type: ignore[arg-type]
    await master.start()
    await master.accounts.create(AccountRecord(id="rita", role="renter", name="Rita"))
    await master.accounts.set_password("rita", PASSWORD)
    client = Console(TestServer(api_app(master)))
    await client.start_server()
    client.master = master
    client.origin = str(client.make_url("")).rstrip("/")
    return client


async def csrf_of(console: Console, path: str = "/console/signin") -> str:
    response = await console.get(path)
    found = CSRF.search(await response.text())
    assert found, f"{path} has no CSRF field"
    return found.group(1)


async def sign_in(console: Console, account: str = "rita", password: str = PASSWORD, **extra: str):
    form = {"account": account, "password": password, "csrf_token": await csrf_of(console), "next": "/console/", **extra}
    return await console.post("/console/signin", data=form, headers={"Origin": console.origin}, allow_redirects=False)
