"""A fake of exactly the Stripe Connect calls the grid makes, for the payout tests: localstripe has no Connect (issue 40
allows a fake of those calls behind the SDK's ``api_base``, in tests only). Served by aiohttp on 127.0.0.1 on a free
port, in the test's own event loop; what the SDK sends is kept (``requests``) so a test checks the SDK's own request
building: paths, form fields, the Idempotency-Key header.

The calls, as Stripe answers them (https://docs.stripe.com/api):
- ``POST /v1/accounts`` (an Express account; ``GET /v1/accounts/{id}``): ``details_submitted`` and
  ``payouts_enabled`` stay false until the owner finishes the hosted onboarding (``complete_onboarding``, or a GET of
  the link's URL, as the owner's browser would);
- ``POST /v1/account_links``: a link to that onboarding;
- ``POST /v1/transfers``: to an onboarded account only (400 otherwise, as Stripe's ``account_invalid``);
- ``GET /v1/transfers``: newest first, filtered by ``transfer_group``, ``destination``, ``created[gte]``; paged with
  ``limit`` (at most ``page_size``) and ``starting_after``.

Idempotency as Stripe keeps it: a POST with an Idempotency-Key seen before answers the first answer again; with other
parameters it is a 400 ``idempotency_error``. ``forget_idempotency_keys`` stands for Stripe's 24-hour expiry.
``lose_next_answers(n)``: the next ``n`` transfer creations are made and their answers lost (a 503 after the work, as
a cut connection), so the SDK's retry with the same key must find the first transfer.

Any other path goes to ``upstream`` (localstripe) when one is given, so one ``api_base`` serves a Master that takes
top-ups and pays providers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.grid import free_port


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    form: dict[str, str]  # the form body (POST) or the query (GET), as the SDK encoded it: "metadata[key]" flat
    headers: dict[str, str]


def _nest(flat: dict[str, str]) -> dict[str, Any]:
    """Stripe's form encoding (``a[b][c]=v``) as nested dictionaries."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.replace("]", "").split("[")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _error(status: int, kind: str, message: str, code: str = "") -> web.Response:
    body = {"error": {"type": kind, "message": message, **({"code": code} if code else {})}}
    return web.json_response(body, status=status)


@dataclass
class FakeConnect:
    upstream: str = ""
    page_size: int = 100
    url: str = ""
    requests: list[SeenRequest] = field(default_factory=list)
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    transfers: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    _idempotent: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=dict)
    _lose: int = 0
    _held: asyncio.Event | None = None  # set: transfers are made, and their answers wait for it
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(int(time.time())))

    # --- what a test does -------------------------------------------------------------------------------------------

    def complete_onboarding(self, reference: str) -> None:
        """The account's owner finished the hosted onboarding, and Stripe's checks passed."""
        self.accounts[reference] |= {"details_submitted": True, "payouts_enabled": True, "charges_enabled": True}

    def forget_idempotency_keys(self) -> None:
        """Stripe's 24-hour expiry of idempotency keys."""
        self._idempotent.clear()

    def lose_next_answers(self, n: int = 1) -> None:
        self._lose = n

    def hold_answers(self) -> asyncio.Event:
        """From now on a transfer is made and its answer waits until the returned event is set (call from the
        fake's own loop): a Master killed meanwhile made a transfer it never heard of."""
        self._held = asyncio.Event()
        return self._held

    def plant_transfer(self, destination: str, amount_minor: int, *, key: str = "", currency: str = "usd") -> dict[str, Any]:
        """A transfer made outside the grid's payout run (a person on Stripe's dashboard): the reconciliation's case."""
        return self._make_transfer(
            {"destination": destination, "amount": str(amount_minor), "currency": currency, "transfer_group": key},
            {"idlegrid_payout": key} if key else {},
        )

    def posted(self, path: str) -> list[SeenRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path == path]

    # --- the server -------------------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/accounts", self._create_account)
        app.router.add_get("/v1/accounts/{id}", self._get_account)
        app.router.add_post("/v1/account_links", self._create_link)
        app.router.add_get("/onboarding/{id}", self._onboard)
        app.router.add_post("/v1/transfers", self._create_transfer)
        app.router.add_get("/v1/transfers", self._list_transfers)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _seen(self, request: web.Request) -> dict[str, str]:
        form = {k: str(v) for k, v in (await request.post()).items()} if request.method == "POST" else dict(request.query)
        self.requests.append(SeenRequest(request.method, request.path, form, dict(request.headers)))
        return form

    async def _replayed(self, request: web.Request, form: dict[str, str]) -> web.Response | None:
        key = request.headers.get("Idempotency-Key", "")
        if not key or key not in self._idempotent:
            return None
        path, params, answer = self._idempotent[key]
        if (path, params) != (request.path, form):
            return _error(400, "idempotency_error", "Keys for idempotent requests can only be used with the same parameters")
        return web.json_response(answer)

    def _remember(self, request: web.Request, form: dict[str, str], answer: dict[str, Any]) -> None:
        key = request.headers.get("Idempotency-Key", "")
        if key:
            self._idempotent[key] = (request.path, form, answer)

    async def _create_account(self, request: web.Request) -> web.Response:
        form = await self._seen(request)
        if (replayed := await self._replayed(request, form)) is not None:
            return replayed
        params = _nest(form)
        reference = "acct_" + secrets.token_hex(8)
        account = {
            "id": reference,
            "object": "account",
            "type": params.get("type", "express"),
            "details_submitted": False,
            "payouts_enabled": False,
            "charges_enabled": False,
            "metadata": params.get("metadata", {}),
            "created": next(self._clock),
        }
        self.accounts[reference] = account
        self._remember(request, form, account)
        return web.json_response(account)

    async def _get_account(self, request: web.Request) -> web.Response:
        await self._seen(request)
        account = self.accounts.get(request.match_info["id"])
        if account is None:
            return _error(404, "invalid_request_error", f"No such account: '{request.match_info['id']}'", "resource_missing")
        return web.json_response(account)

    async def _create_link(self, request: web.Request) -> web.Response:
        form = await self._seen(request)
        reference = form.get("account", "")
        if reference not in self.accounts:
            return _error(400, "invalid_request_error", f"No such account: '{reference}'", "resource_missing")
        now = next(self._clock)
        link = {"object": "account_link", "url": f"{self.url}/onboarding/{reference}", "created": now, "expires_at": now + 300}
        return web.json_response(link)

    async def _onboard(self, request: web.Request) -> web.Response:
        self.complete_onboarding(request.match_info["id"])
        return web.Response(text="onboarded")

    async def _create_transfer(self, request: web.Request) -> web.Response:
        form = await self._seen(request)
        if (replayed := await self._replayed(request, form)) is not None:
            return replayed
        params = _nest(form)
        account = self.accounts.get(form.get("destination", ""))
        if account is None or not account["payouts_enabled"]:
            return _error(400, "invalid_request_error", "The destination account cannot take transfers yet", "account_invalid")
        transfer = self._make_transfer(form, params.get("metadata", {}))
        self._remember(request, form, transfer)
        if self._held is not None:
            await self._held.wait()
        if self._lose > 0:
            self._lose -= 1
            return _error(503, "api_error", "the answer was lost on the way back")
        return web.json_response(transfer)

    def _make_transfer(self, form: dict[str, str], metadata: dict[str, str]) -> dict[str, Any]:
        transfer = {
            "id": "tr_" + secrets.token_hex(8),
            "object": "transfer",
            "amount": int(form["amount"]),
            "currency": form.get("currency", "usd"),
            "destination": form["destination"],
            "transfer_group": form.get("transfer_group") or None,
            "metadata": metadata,
            "created": next(self._clock),
            "reversed": False,
        }
        self.transfers.append(transfer)
        return transfer

    async def _list_transfers(self, request: web.Request) -> web.Response:
        query = _nest(await self._seen(request))
        found = list(reversed(self.transfers))  # newest first, as Stripe lists
        if "transfer_group" in query:
            found = [t for t in found if t["transfer_group"] == query["transfer_group"]]
        if "destination" in query:
            found = [t for t in found if t["destination"] == query["destination"]]
        created = query.get("created")
        if isinstance(created, dict) and "gte" in created:
            found = [t for t in found if t["created"] >= int(created["gte"])]
        if "starting_after" in query:
            ids = [t["id"] for t in found]
            found = found[ids.index(query["starting_after"]) + 1 :] if query["starting_after"] in ids else []
        limit = min(int(query.get("limit", 10)), self.page_size)
        page = {"object": "list", "url": "/v1/transfers", "data": found[:limit], "has_more": len(found) > limit}
        return web.json_response(page)

    async def _forward(self, request: web.Request) -> web.Response:
        if not self.upstream:
            return _error(404, "invalid_request_error", f"Unrecognized request URL ({request.method}: {request.path})")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with aiohttp.ClientSession() as session:
            async with session.request(
                request.method, self.upstream + request.path_qs, data=await request.read(), headers=headers
            ) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type=resp.content_type)


@asynccontextmanager
async def fake_connect_server(upstream: str = "", port: int = 0) -> AsyncIterator[FakeConnect]:
    """A FakeConnect served on 127.0.0.1 (on ``port``, or a free one) for the ``async with`` block, always stopped."""
    fake = FakeConnect(upstream=upstream)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def form_of(seen: SeenRequest) -> dict[str, Any]:
    """A seen request's parameters, nested (for reading in a test)."""
    return json.loads(json.dumps(_nest(seen.form)))


class ThreadedFakeConnect:
    """A FakeConnect on an event loop of its own (a thread), for synchronous tests (a grid's Master in another process)."""

    def __init__(self, fake: FakeConnect, loop: asyncio.AbstractEventLoop) -> None:
        self.fake = fake
        self._loop = loop

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the fake's loop (what touches its asyncio objects)."""

        async def called() -> Any:
            return fn(*args)

        return self.run(called())


@contextmanager
def threaded_fake_connect(upstream: str = "") -> Iterator[ThreadedFakeConnect]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-connect", daemon=True)
    thread.start()
    serving = fake_connect_server(upstream)
    threaded = ThreadedFakeConnect(asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result(10), loop)
    try:
        yield threaded
    finally:
        try:
            threaded.run(serving.__aexit__(None, None, None))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
