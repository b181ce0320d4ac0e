"""``AccessRelay``: the agent server, the Master link and the HTTPS endpoint of one relay, started and stopped together."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import signal

from access.config import AccessConfig
from access.http import RelayHttp
from access.metrics import RelayMetrics
from access.relay import AgentGateway
from access.tunnels import TunnelExchange
from access.upstream import MasterLink
from common.loopwatch import watching
from common.pki import client_tls_context, load_cert, server_tls_context

log = logging.getLogger(__name__)

# asyncio gives every TLS connection a 256 KiB read buffer; frames of any size still arrive with a smaller
# one, in more reads. Measured with 2,000 agents (bench/HISTORY.md): 32 KiB -> 99 KiB of relay RSS per agent,
# 16 KiB -> 82, 4 KiB -> 62, at the same throughput of small frames (agents' frames are mostly < 4 KiB).
TLS_READ_BUFFER_BYTES = 4 * 1024


class AccessRelay:
    """One Access relay. ``start()`` binds both servers and begins dialling the Master; ``stop()`` undoes it."""

    def __init__(self, config: AccessConfig) -> None:
        self.config = config
        self.metrics = RelayMetrics(config.relay_id)
        self.link = MasterLink(
            config,
            client_tls_context(config.ca_file, config.cert_file, config.key_file),
            self.metrics,
            public_url=config.public_url,
        )
        with open(config.ca_file, "rb") as ca:
            ca_cert = load_cert(ca.read())
        self.tunnels = TunnelExchange(
            relay_id=config.relay_id,
            ca_cert=ca_cert,
            metrics=self.metrics,
            default_bytes_per_s=config.tunnel_bytes_per_s,
            max_tunnels=config.max_tunnels,
            max_tunnels_per_agent=config.max_tunnels_per_agent,
            grace_s=config.tunnel_grace_s,
        )
        self.agents = AgentGateway(
            config,
            server_tls_context(config.cert_file, config.key_file, config.ca_file, require_client_cert=True),
            self.link,
            self.metrics,
            self.tunnels,
        )
        self.http = RelayHttp(
            config,
            server_tls_context(config.cert_file, config.key_file, config.ca_file, require_client_cert=False),
            self.link,
            self.metrics,
            agent_count=lambda: self.agents.agent_count,
            agent_url=lambda: self.agent_url,
            tunnels=self.tunnels,
        )
        self._started = False

    @property
    def agent_url(self) -> str:
        return self.config.public_url or f"wss://{self.config.agent_host}:{self.agents.port}"

    @property
    def http_url(self) -> str:
        """Where renters reach the HTTPS port (tunnels): ``http_public_url``, or the bound address."""
        return self.config.http_public_url or f"https://{self.config.http_host}:{self.http.port}"

    async def start(self) -> None:
        self._started = True
        try:
            await self.agents.start()
            await self.http.start()
        except BaseException:
            await self.stop()  # e.g. the HTTPS port is taken: do not leave the agent server behind
            raise
        if not self.link.public_url:
            self.link.public_url = self.agent_url  # known only now when agent_port is 0
        self.link.http_url = self.http_url  # likewise when http_port is 0
        await self.link.start()
        log.info(
            "access relay started",
            extra={
                "relay": self.config.relay_id,
                "region": self.config.region,
                "agent_url": self.agent_url,
                "http_url": self.http_url,
                "master_urls": self.config.masters,
            },
        )

    async def stop(self) -> None:
        """Give the Master what is buffered (up to drain_timeout_s in all), let the agents go, then close everything.

        The buffer is flushed while the agents are still here: a Master link that must be redialled for it
        announces them again, and the Master takes frames only from agents announced on the link. Then the
        agents are let go, and their goodbyes (with whatever they sent meanwhile) follow in the time left.
        """
        if not self._started:
            return
        self._started = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout_s
        if self.config.drain_timeout_s > 0 and len(self.link.buffer):
            await self.link.flush(self.config.drain_timeout_s)
        await self.tunnels.close_all()  # their agents' data connections would otherwise just drop with the server
        await self.agents.stop()
        await self.link.stop(max(0.0, deadline - loop.time()))
        await self.http.stop()
        log.info("access relay stopped", extra={"relay": self.config.relay_id})


async def serve(config: AccessConfig) -> None:
    """Run a relay until SIGTERM or SIGINT."""
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
    relay = AccessRelay(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await relay.start()
    try:
        async with watching("relay", relay.metrics.registry):
            await stopping.wait()
        log.info("shutting down", extra={"relay": config.relay_id})
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await relay.stop()
