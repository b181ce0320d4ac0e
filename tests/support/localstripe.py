"""A real Stripe-compatible server for the payment tests: ``localstripe`` (PyPI), a stateful fake of Stripe's API
(PaymentIntents, test payment methods such as ``pm_card_visa``, events, signed webhooks), started on 127.0.0.1 on a
free port and always stopped. The SDK is pointed at it with ``api_base``.

Two things of localstripe are set by the launcher below, not by its command line: it would listen on every interface
(``::``), and it writes its whole state to /tmp/localstripe.pickle at every change (shared by every instance on the
machine). The launcher serves its app on 127.0.0.1 only and keeps the state in memory.

What localstripe lacks, as the tests use it (docs/payments.md, "How the tests run Stripe"):
- Checkout Sessions (the grid uses PaymentIntents, which it has);
- ``amount_received`` on a PaymentIntent (the adapter then reads ``amount`` of a succeeded intent);
- confirming with a payment method in one call (``confirm`` with ``payment_method`` answers 500): the tests set the
  test payment method with an update, then confirm, as Stripe.js would on the renter's side;
- Connect (accounts, account links, transfers): the payout tests use tests/support/fake_connect.py, a fake of exactly
  the calls the grid makes, which can forward every other path here (``upstream``).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import stripe

from tests.support.grid import free_port
from tests.support.processes import stop_process

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it

_LAUNCHER = """
import sys
from aiohttp import web
from localstripe import resources, server
resources.Store.dump_to_disk = lambda self: None  # state in memory only, never /tmp/localstripe.pickle
web.run_app(server.app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


class LocalStripeError(RuntimeError):
    """localstripe could not be started."""


@dataclass(frozen=True)
class LocalStripe:
    """One running localstripe: its URL (the SDK's ``api_base``) and a test-mode API key (localstripe takes any)."""

    url: str
    api_key: str = "sk_test_idlegrid"

    def client(self, http: stripe.AIOHTTPClient) -> stripe.StripeClient:
        """The SDK's client against this server, on ``http`` (close it after use)."""
        return stripe.StripeClient(self.api_key, base_addresses={"api": self.url}, http_client=http)

    async def send_webhooks_to(self, url: str, secret: str, *, name: str = "grid") -> None:
        """Have localstripe deliver every event it makes to ``url``, signed with ``secret`` (its own config route)."""
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.url}/_config/webhooks/{name}", data={"url": url, "secret": secret}) as resp:
                if resp.status != 200:
                    raise LocalStripeError(f"localstripe refused the webhook: {resp.status} {await resp.text()}")

    async def pay(self, reference: str, payment_method: str = "pm_card_visa") -> Any:
        """Pay PaymentIntent ``reference`` with one of Stripe's test payment methods, as the renter's browser does on
        Stripe's element (never card data in the grid); returns the confirmed intent."""
        http = stripe.AIOHTTPClient()
        client = self.client(http)
        try:
            await client.v1.payment_intents.update_async(reference, params={"payment_method": payment_method})
            return await client.v1.payment_intents.confirm_async(reference)
        finally:
            await http.close_async()


@contextmanager
def local_stripe(workdir: Path) -> Iterator[LocalStripe]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "localstripe.log"
    for _ in range(START_ATTEMPTS):
        port = free_port()
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        try:
            if _wait_ready(process, port):
                yield LocalStripe(f"http://127.0.0.1:{port}")
                return
        finally:
            stop_process(process, STOP_TIMEOUT_S)
    raise LocalStripeError(f"localstripe did not start after {START_ATTEMPTS} attempts; its log:\n{log.read_text()[-3000:]}")


def _wait_ready(process: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@pytest.fixture
def localstripe(tmp_path: Path) -> Iterator[LocalStripe]:
    """A localstripe of the test's own (its state and webhooks are the server's, global to it)."""
    with local_stripe(tmp_path / "localstripe") as server:
        yield server


async def wait_for(predicate: Any, timeout_s: float = 15.0) -> None:
    """Until ``predicate()`` is true (localstripe delivers webhooks a second after the event, on its own task)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for localstripe's webhook")
        await asyncio.sleep(0.05)


__all__ = ["LocalStripe", "LocalStripeError", "local_stripe", "localstripe", "wait_for"]
