"""Runs the Master's container commands: verified, at most once, each result kept until acknowledged."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from agent.ledger import CommandLog, LedgerEntry
from agent.runtime.base import ContainerRuntime
from common.containers import (
    LABEL_AGENT_ID,
    LABEL_COMMAND_ID,
    LABEL_RENTAL_ID,
    ContainerInfo,
    parse_create_spec,
    parse_delete_spec,
)
from common.errors import IdlegridError, SignatureError
from common.pki import CommandVerifier
from common.wire import Command, CommandResult, signing_bytes

log = logging.getLogger(__name__)


class CommandExecutor:
    def __init__(self, agent_id: str, ledger: CommandLog, runtime: ContainerRuntime, verifier: CommandVerifier) -> None:
        self.agent_id = agent_id
        self.ledger = ledger
        self.runtime = runtime
        self.verifier = verifier

    async def execute(self, command: Command) -> CommandResult:
        """Return the command's result, running it only if this host has never run that id."""
        body = command.body
        try:
            self._verify(command)
        except SignatureError as exc:
            log.warning("refused command %s: %s", body.id, exc)
            return CommandResult(id=body.id, ok=False, error=f"command refused: {exc}", error_code=exc.code)
        done = self.ledger.get(body.id)
        if done is not None and done.finished:
            return _result(done)
        if done is None and body.deadline < time.time():
            return self._finish(
                body.id,
                body.kind,
                ok=False,
                result={},
                error="deadline passed before the command arrived",
                code="deadline_passed",
            )
        self.ledger.start(body.id, body.kind)  # on disk before the runtime acts
        try:
            info = await self._run(body.id, body.kind, body.spec, resumed=done is not None)
        except IdlegridError as exc:
            return self._finish(body.id, body.kind, ok=False, result={}, error=str(exc), code=exc.code)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            return self._finish(body.id, body.kind, ok=False, result={}, error=f"invalid spec: {exc}", code="invalid_spec")
        result = {"container": msgspec.to_builtins(info)} if info is not None else {"container": None}
        return self._finish(body.id, body.kind, ok=True, result=result, error=None, code=None)

    def _verify(self, command: Command) -> None:
        body = command.body
        if body.agent_id != self.agent_id:
            raise SignatureError(f"command is addressed to {body.agent_id}, not to this agent ({self.agent_id})")
        self.verifier.verify(body.key_id, signing_bytes(body), command.signature)

    async def _run(self, command_id: str, kind: str, spec: dict[str, Any], *, resumed: bool) -> ContainerInfo | None:
        if kind == "create_container":
            container = parse_create_spec(spec)
            labels = {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: self.agent_id}
            if container.rental_id:
                labels[LABEL_RENTAL_ID] = container.rental_id
            if resumed:
                # Started before a crash: the runtime knows whether the container came to be.
                existing = await self.runtime.find(LABEL_COMMAND_ID, command_id)
                if existing:
                    return existing[0]
            return await self.runtime.create(container, labels=labels)
        if kind == "delete_container":
            target = parse_delete_spec(spec)
            return await self.runtime.delete(target.name, timeout_s=target.timeout_s)
        raise IdlegridError(f"this agent does not know the command kind {kind!r}", code="unknown_command")

    def _finish(
        self, command_id: str, kind: str, *, ok: bool, result: dict, error: str | None, code: str | None
    ) -> CommandResult:
        self.ledger.finish(command_id, kind, ok=ok, result=result, error=error, error_code=code)
        return CommandResult(id=command_id, ok=ok, result=result, error=error, error_code=code)

    def pending_results(self) -> list[CommandResult]:
        return [_result(entry) for entry in self.ledger.unacked()]


def _result(entry: LedgerEntry) -> CommandResult:
    return CommandResult(id=entry.id, ok=bool(entry.ok), result=entry.result, error=entry.error, error_code=entry.error_code)
