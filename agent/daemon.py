"""The agent daemon: dials out to an Access relay, reports, and runs the Master's commands."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from pathlib import Path

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from agent.backoff import full_jitter
from agent.config import AgentConfig
from agent.executor import CommandExecutor
from agent.gpus import open_collector
from agent.host import collect_host_info
from agent.identity import AgentIdentity
from agent.ledger import CommandLog
from agent.runtime import open_runtime
from common.errors import ConfigError, IdlegridError, ProtocolError, SignatureError
from common.inventory import HostInfo, Inventory
from common.pki import CommandVerifier, client_tls_context, load_cert, verify_key_endorsement
from common.wire import (
    HARD_FRAME_BYTES,
    PROTOCOL_VERSIONS,
    Command,
    CommandAck,
    Config,
    Error,
    Heartbeat,
    Hello,
    Ping,
    ResultAck,
    Telemetry,
    Welcome,
    decode_master_frame,
    encode,
)

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
HELLO_REQUIRED = "hello_required"


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.identity = AgentIdentity.load(config.state_path)
        self.urls = list(config.access_urls or self.identity.access_urls)
        if not self.urls:
            raise ConfigError("no Access relay to connect to: set access_urls (--access wss://HOST:PORT)")
        self.collector = open_collector(config.simulate or None, host_key=str(config.state_path.resolve()))
        self.ca_cert = load_cert(self.identity.ca_file.read_bytes())
        self.verifier = CommandVerifier(self.identity.command_keys)
        for key_id in self.identity.retired_keys:
            self.verifier.retire_key(key_id)
        self.ledger = CommandLog(config.state_path / "commands.db")
        options = {"state_dir": config.state_path} if config.runtime == "process" else {"socket": config.docker_socket}
        self.runtime = open_runtime(config.runtime, **options)
        self.executor = CommandExecutor(self.identity.agent_id, self.ledger, self.runtime, self.verifier)
        self.host: HostInfo = collect_host_info(config.state_path)
        self.heartbeat_s = 5.0
        self.telemetry_s = 10.0
        self.connected = asyncio.Event()
        self.relay_url = ""
        self._ws: ClientConnection | None = None
        self._seq = itertools.count(1)
        self._ping: str | None = None
        self._running: set[asyncio.Task] = set()
        self._inflight: set[str] = set()
        self._stopping = asyncio.Event()

    # --- connection ----------------------------------------------------------------------------

    async def run(self) -> None:
        background = [asyncio.create_task(self._bandwidth_loop())] if self.config.measure_bandwidth else []
        attempt = 0
        urls = itertools.cycle(self.urls)
        try:
            while not self._stopping.is_set():
                url = next(urls)
                try:
                    await self._connect(url)
                    attempt = 0
                except (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError, ProtocolError) as exc:
                    log.warning("relay connection failed", extra={"relay": url, "error": str(exc) or type(exc).__name__})
                self.connected.clear()
                if self._stopping.is_set():
                    break
                delay = full_jitter(attempt, initial_s=self.config.backoff_initial_s, max_s=self.config.backoff_max_s)
                attempt += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        finally:
            for task in background:
                task.cancel()
            await self.close()

    def stop(self) -> None:
        self._stopping.set()
        if self._ws is not None:
            asyncio.ensure_future(self._ws.close())

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        await self.runtime.close()
        self.collector.close()
        self.ledger.close()

    async def _connect(self, url: str) -> None:
        ssl_context = client_tls_context(self.identity.ca_file, self.identity.cert_file, self.identity.key_file)
        async with connect(url, ssl=ssl_context, max_size=HARD_FRAME_BYTES, open_timeout=10, compression=None) as ws:
            self._ws, self.relay_url = ws, url
            log.info("connected to relay", extra={"relay": url})
            await self._send(self._hello())
            tasks = [asyncio.create_task(self._heartbeat_loop(ws)), asyncio.create_task(self._telemetry_loop(ws)),
                     asyncio.create_task(self._resend_loop(ws))]
            try:
                async for message in ws:
                    await self._on_message(message)
            finally:
                self._ws = None
                for task in tasks:
                    task.cancel()

    async def _send(self, frame: msgspec.Struct) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        await ws.send(encode(frame), text=True)

    def _hello(self) -> Hello:
        inventory = Inventory(host=self.host, gpus=self.collector.inventory(), simulated=self.collector.simulated)
        return Hello(versions=list(PROTOCOL_VERSIONS), agent_version=AGENT_VERSION, inventory=inventory,
                     region=self.config.region, command_keys=sorted(self.verifier.keys()))

    # --- frames from the master ----------------------------------------------------------------

    async def _on_message(self, message: str | bytes) -> None:
        try:
            frame = decode_master_frame(message)
        except ProtocolError as exc:
            log.warning("bad frame from relay: %s", exc)
            return
        match frame:
            case Welcome():
                self._on_welcome(frame)
            case Command():
                self._spawn(self._on_command(frame))
            case ResultAck():
                self.ledger.mark_acked(frame.id)
            case Ping():
                self._ping = frame.nonce
            case Config():
                self._on_config(frame)
            case Error() if frame.code == HELLO_REQUIRED:
                await self._send(self._hello())
            case Error():
                log.warning("relay or master reported an error", extra={"code": frame.code, "detail": frame.message})

    def _on_welcome(self, welcome: Welcome) -> None:
        self.heartbeat_s, self.telemetry_s = welcome.heartbeat_s, welcome.telemetry_s
        self._update_keys(welcome.command_keys, welcome.key_endorsements, welcome.retired_keys)
        self.connected.set()
        log.info("welcomed by the master", extra={"agent_id": welcome.agent_id, "protocol": welcome.version})

    def _on_config(self, config: Config) -> None:
        self.heartbeat_s = config.heartbeat_s or self.heartbeat_s
        self.telemetry_s = config.telemetry_s or self.telemetry_s
        self._update_keys(config.command_keys or {}, config.key_endorsements or {}, config.retired_keys or [])

    def _update_keys(self, keys: dict[str, str], endorsements: dict[str, str], retired: list[str]) -> None:
        """Keys arrive through relays, so only keys the platform CA endorsed are trusted."""
        trusted = self.verifier.keys()
        for key_id, public in keys.items():
            if key_id in retired or trusted.get(key_id) == public:
                continue
            try:
                verify_key_endorsement(self.ca_cert, public, endorsements.get(key_id, ""))
                self.verifier.add_key(key_id, public)
            except SignatureError as exc:
                log.warning("ignored command-signing key %s: %s", key_id, exc)
        for key_id in retired:
            self.verifier.retire_key(key_id)
        self.identity.command_keys = self.verifier.keys()
        self.identity.retired_keys = sorted(set(self.identity.retired_keys) | set(retired))
        self.identity.save()

    async def _on_command(self, command: Command) -> None:
        command_id = command.body.id
        await self._send(CommandAck(id=command_id))
        if command_id in self._inflight:
            return  # a resend of a command still running here: its result follows when it is done
        self._inflight.add(command_id)
        try:
            result = await self.executor.execute(command)
        finally:
            self._inflight.discard(command_id)
        with contextlib.suppress(ConnectionError, ConnectionClosed):
            await self._send(result)  # if the link is down, the resend loop delivers it later

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    # --- periodic reports ----------------------------------------------------------------------

    async def _heartbeat_loop(self, ws: ClientConnection) -> None:
        await self.connected.wait()  # the welcome sets the interval
        while True:
            running = sorted(c.name for c in await self.runtime.list() if c.state == "running")
            await self._send(Heartbeat(seq=next(self._seq), ts=time.time(), running=running, ping=self._ping))
            await asyncio.sleep(self.heartbeat_s)

    async def _telemetry_loop(self, ws: ClientConnection) -> None:
        await self.connected.wait()
        while True:
            await asyncio.sleep(self.telemetry_s)
            samples = await asyncio.to_thread(self.collector.sample)
            if samples:
                await self._send(Telemetry(ts=time.time(), samples=samples))

    async def _resend_loop(self, ws: ClientConnection) -> None:
        """Results stay in the ledger until the Master acknowledges them."""
        while True:
            for result in self.executor.pending_results():
                await self._send(result)
            await asyncio.sleep(self.config.result_resend_s)

    async def _bandwidth_loop(self) -> None:
        from agent.bandwidth import measure_bandwidth

        base = self.identity.http_url
        if not base:
            return
        while True:
            try:
                figures = await measure_bandwidth(base, ca_file=self.identity.ca_file)
                self.host = msgspec.structs.replace(
                    self.host, bandwidth_mbps_down=figures.download_mbps, bandwidth_mbps_up=figures.upload_mbps,
                    latency_ms=figures.latency_ms,
                )
                if self._ws is not None:
                    await self._send(self._hello())  # a hello refreshes the inventory the Master holds
            except (IdlegridError, ConnectionError, ConnectionClosed) as exc:
                log.warning("bandwidth measurement failed: %s", exc)
            await asyncio.sleep(self.config.bandwidth_interval_s)


async def serve(config: AgentConfig) -> None:
    agent = Agent(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()
