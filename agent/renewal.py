"""When the agent asks the Master for a new certificate, on which connection: the I/O side of CertificateRenewer.

``CertificateRenewer`` (agent/credentials.py) decides when a renewal is due and checks the answer; ``RenewalTimer``
sends the request at that time on the connection the Master welcomed, and takes the answer (``renew_response``,
agent/session.py ``RenewalAnswered``). One timer per connection, started at the welcome: requests go only to a Master
that answers. It ends by itself when its connection closes, so a graceful stop never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from agent.credentials import CertificateRenewer, RenewalError
from common.wire import RenewResponse, encode

log = logging.getLogger(__name__)


class RenewalTimer:
    def __init__(self, renewer: CertificateRenewer) -> None:
        self.renewer = renewer
        self._current: tuple[ClientConnection, asyncio.Task[None]] | None = None  # the timer of the current connection
        self._news = asyncio.Event()  # an answer arrived: the timer looks again

    def start(self, ws: ClientConnection) -> None:
        """The Master welcomed ``ws``: renew on it when due."""
        current = self._current
        if current is not None and current[0] is ws and not current[1].done():
            return  # a second welcome on the same connection (after a refreshed hello) keeps the timer
        if current is not None:
            current[1].cancel()
        self._current = (ws, asyncio.create_task(self._run(ws), name="certificate-renewal"))

    def answered(self, response: RenewResponse) -> None:
        """The Master's answer: the new certificate installed for the next connection, or why not."""
        try:
            identity = self.renewer.accept(response, time.time())
        except RenewalError as exc:
            log.warning("certificate not renewed: %s", exc)
        else:
            # This connection keeps its TLS session; the next one presents the new certificate.
            log.info("certificate renewed", extra={"serial": identity.serial, "not_after": identity.not_after})
        self._news.set()

    async def _run(self, ws: ClientConnection) -> None:
        closed = asyncio.ensure_future(ws.wait_closed())
        renewer = self.renewer
        try:
            while not closed.done():
                wait = renewer.next_attempt_at() - time.time()
                if wait > 0:
                    self._news.clear()
                    news = asyncio.ensure_future(self._news.wait())
                    await asyncio.wait({closed, news}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                    news.cancel()
                    continue
                log.info("renewing the certificate", extra={"serial": renewer.serial, "not_after": renewer.not_after})
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(encode(renewer.request(time.time())), text=True)
        finally:
            closed.cancel()
