"""The grid's operator answers: commands sent to hosts (their bodies as signed, secrets redacted), enrollment
tokens, the event log and the command-signing keys."""

from __future__ import annotations

from collections.abc import Mapping

from common.containers import WireSpec
from management.views.base import Time, View, page_of, rfc3339
from management.views.workloads import (
    redact_registry_auth,
)
from master.port import (
    AgentResult,
    CommandRecord,
    EventData,
    EventRecord,
    SigningKeyInfo,
    TokenRecord,
)


class CommandView(View):
    id: str
    agent_id: str
    kind: str
    spec: WireSpec  # the command's body as signed (its kind's type, encoded), secrets redacted
    state: str
    created_at: Time | None
    deadline: Time | None
    sent_at: Time | None
    acked_at: Time | None
    finished_at: Time | None
    attempts: int
    key_id: str
    result: AgentResult | None  # what the agent reported
    error: str | None


class CommandAccepted(View):
    id: str
    state: str


class EventView(View):
    seq: int
    ts: Time | None
    kind: str
    subject: str
    data: EventData


class TokenView(View):
    token: str  # shown this once
    provider: str
    expires_at: Time | None


class SigningKeyView(View):
    key_id: str
    public_key: str
    state: str
    created_at: Time | None
    retired_at: Time | None


CommandPage = page_of(CommandView)


EventPage = page_of(EventView)


SigningKeyPage = page_of(SigningKeyView)


def redact_container_secrets(spec: WireSpec) -> WireSpec:
    """A create command's spec as answers show it: the registry password gone (``redact_registry_auth``), the env's
    values hidden (they may be the renter's secrets, resolved from ``${secret:NAME}``), the storage keys reduced to
    the key id (docs/storage.md)."""
    shown = redact_registry_auth(spec)
    env = shown.get("env")
    if isinstance(env, Mapping):
        shown["env"] = {name: "<hidden>" for name in env}
    storage = shown.get("storage")
    if isinstance(storage, Mapping) and isinstance(storage.get("credentials"), Mapping):
        shown["storage"] = {**storage, "credentials": {"access_key_id": storage["credentials"].get("access_key_id", "")}}
    return shown


def command_view(command: CommandRecord) -> CommandView:
    return CommandView(
        id=command.id,
        agent_id=command.agent_id,
        kind=command.kind,
        spec=redact_container_secrets(command.spec),
        state=command.state,
        created_at=rfc3339(command.created_at),
        deadline=rfc3339(command.deadline),
        sent_at=rfc3339(command.sent_at),
        acked_at=rfc3339(command.acked_at),
        finished_at=rfc3339(command.finished_at),
        attempts=command.attempts,
        key_id=command.key_id,  # the command-signing key its signature is made with
        result=command.result,
        error=command.error,
    )


def event_view(event: EventRecord) -> EventView:
    """``data`` is the event's payload as recorded (its own fields, numbers included, are not reinterpreted)."""
    return EventView(seq=event.seq, ts=rfc3339(event.ts), kind=event.kind, subject=event.subject, data=event.data)


def token_view(token: str, record: TokenRecord) -> TokenView:
    """The token itself is shown this once; only its hash is kept."""
    return TokenView(token=token, provider=record.provider, expires_at=rfc3339(record.expires_at))


def command_accepted_view(command: CommandRecord) -> CommandAccepted:
    return CommandAccepted(id=command.id, state=command.state)


def signing_key_view(key: SigningKeyInfo) -> SigningKeyView:
    return SigningKeyView(
        key_id=key.key_id,
        public_key=key.public_key,
        state=key.state.value,
        created_at=rfc3339(key.created_at),
        retired_at=rfc3339(key.retired_at),
    )
