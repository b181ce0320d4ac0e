"""A compromised relay stand-in: it holds a valid relay certificate, sits between an agent and the real
relay, and rewrites the spec of a command in transit (keeping the Master's signature).

It notes every command copy it passes down and every ack it passes up, so a test can say what the agent was sent and
that it answered each copy. Asked to, it also withholds the agent's answers to the copy it tampered and asks the agent
for its hello again (what a Master whose session restarted asks): the Master, which has not heard the refusal, resends
the command at that hello, intact, and the agent's answers go up from then on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from common.pki import CertRole, client_tls_context, server_tls_context
from tests.support.grid import Grid, free_port


class TamperingRelay:
    def __init__(self, grid: Grid, upstream_url: str, agent_dir: Path) -> None:
        self.port = free_port()
        cert, key, ca = grid.authority.write_server_identity(grid.root / "rogue-relay", CertRole.ACCESS, "relay-rogue")
        self._server_ssl = server_tls_context(cert, key, ca, require_client_cert=True)
        # The stand-in speaks to the real relay as the agent; a real compromised relay would simply forward.
        self._client_ssl = client_tls_context(agent_dir / "ca.crt", agent_dir / "agent.crt", agent_dir / "agent.key")
        self._upstream = upstream_url
        self._armed = threading.Event()
        self._ask_hello_after_tampering = False
        self._withheld: set[str] = set()  # tampered ids whose answers are swallowed until an intact copy went down
        self.tampered: list[str] = []
        self.commands: list[str] = []  # the id of every command copy passed down, tampered or not, in order
        self.acks: list[str] = []  # the id of every command ack passed up
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def agent_url(self) -> str:
        return f"wss://127.0.0.1:{self.port}"

    def tamper_next_command(self, *, then_ask_hello: bool = False) -> None:
        """Rewrite the next command that passes; ``then_ask_hello``: swallow the agent's acks and results for it until
        an intact copy of it went down, and at its first result ask the agent for a hello (``hello_required``)."""
        self._ask_hello_after_tampering = then_ask_hello
        self._armed.set()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        self._server = await serve(self._pipe, "127.0.0.1", self.port, ssl=self._server_ssl)

    async def _stop(self) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _pipe(self, agent: ServerConnection) -> None:
        async with connect(self._upstream, ssl=self._client_ssl) as relay:
            self.connections += 1

            async def down() -> None:
                async for message in relay:
                    await agent.send(self._maybe_tamper(message))

            async def up() -> None:
                asked_hello = False
                async for message in agent:
                    frame = json.loads(message)
                    if frame.get("type") == "command_ack":
                        self.acks.append(frame["id"])
                    if frame.get("type") in ("command_ack", "command_result") and frame["id"] in self._withheld:
                        if frame["type"] == "command_result" and not asked_hello:
                            asked_hello = True
                            await agent.send(json.dumps({"type": "error", "code": "hello_required", "message": "hello"}))
                        continue  # swallowed: the Master does not hear it
                    await relay.send(message)

            tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()

    def _maybe_tamper(self, message: str | bytes) -> str | bytes:
        frame = json.loads(message)
        if frame.get("type") != "command":
            return message
        command_id = frame["body"]["id"]
        self.commands.append(command_id)
        if not self._armed.is_set():
            self._withheld.discard(command_id)  # an intact copy: what the agent answers from now on goes up
            return message
        self._armed.clear()
        frame["body"]["spec"]["command"] = ["sh", "-c", "echo owned"]
        self.tampered.append(command_id)
        if self._ask_hello_after_tampering:
            self._withheld.add(command_id)
        return json.dumps(frame)


@contextlib.contextmanager
def tampering_relay(grid: Grid, agent_name: str, relay_id: str = "relay-1") -> Iterator[TamperingRelay]:
    relay = TamperingRelay(grid, grid.relays[relay_id].agent_url, grid.agent_dir(agent_name))
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()
