"""The one client of the management API, used by the CLI, the demo, the tests and the benchmarks.

The calls themselves are written once, without I/O (websockets' shape): an ``ApiRequest`` says what to send,
``read_answer`` turns what came back into JSON or an ``ApiError`` carrying the API's error code and HTTP status,
and ``next_page`` follows the cursor of a list. Two thin transports move the bytes: ``ApiClient`` (blocking,
the standard library's urllib; for the CLI and tests) and ``AsyncApiClient`` (aiohttp; for the demo's and the
benchmark's event loops). Both authenticate with a bearer API key.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from common.errors import IdlegridError

if TYPE_CHECKING:  # imported when an AsyncApiClient first sends: the CLI's blocking client never pays for aiohttp
    import aiohttp

Json = Any
# An API answer (or a part of one) as the client decodes it: plain JSON whose shape is the API's (management/views/),
# of which the CLI reads the fields it shows, so it is open on this side.
AnswerJson = dict[str, Any]
# A request body the CLI builds by hand from its flags: the API's own Struct checks it on arrival, so it is open here.
BodyJson = dict[str, Any]
R = TypeVar("R")

API_PREFIX = "/api/v1"
REQUEST_TIMEOUT_S = 30.0
# A list call asks for this many items a page; the API caps it (1,000) and defaults to 100.
PAGE_LIMIT = 500
# A call answered 429 (the key's rate limit: nothing was done) is sent again after its Retry-After, this many times.
RATE_LIMIT_RETRIES = 3
MAX_RETRY_AFTER_S = 5.0


class ApiError(IdlegridError):
    """The API answered with an error: ``status`` is the HTTP status, ``code`` the API's error code."""

    def __init__(self, status: int, code: str, message: str, body: Json = None) -> None:
        super().__init__(f"{status} {code}: {message}", code=code)
        self.status = status
        self.detail = message
        self.body = body


class ApiUnreachable(ApiError):
    """Nothing answered at the API's address (status 0: no HTTP exchange happened)."""

    def __init__(self, base_url: str, reason: object) -> None:
        super().__init__(0, "unreachable", f"cannot reach the management API at {base_url}: {reason}")
        self.args = (f"cannot reach the management API at {base_url}: {reason}",)


@dataclass(frozen=True)
class ApiRequest:
    """One HTTP call of the API, before any I/O."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Json = None

    def url(self, base_url: str) -> str:
        query = f"?{urllib.parse.urlencode(self.query)}" if self.query else ""
        return base_url.rstrip("/") + self.path + query

    def payload(self) -> bytes | None:
        return json.dumps(self.body, allow_nan=False).encode() if self.body is not None else None


def retry_after_s(status: int, headers: Mapping[str, str], attempt: int) -> float | None:
    """How long to wait before sending a call again that was answered ``status``; None: do not send it again.

    Only a 429 is sent again (the API did nothing with it), after its ``Retry-After`` (capped), a few times."""
    if status != 429 or attempt >= RATE_LIMIT_RETRIES:
        return None
    given = next((value for name, value in headers.items() if name.lower() == "retry-after"), "1")
    try:
        wait = float(given)
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_AFTER_S) if math.isfinite(wait) else MAX_RETRY_AFTER_S


def read_answer(request: ApiRequest, status: int, raw: bytes) -> Json:
    """The JSON body of a 2xx answer; any other status raises ``ApiError`` with the API's own code and message."""
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode(errors="replace")
    if 200 <= status < 300:
        return body
    error = body.get("error", {}) if isinstance(body, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    raise ApiError(status, code or "http_error", message or f"{request.method} {request.path} answered {status}", body)


def next_page(request: ApiRequest, page: Json) -> ApiRequest | None:
    """The request for the page after ``page``, or None on the last page (no ``next_cursor``)."""
    cursor = page.get("next_cursor") if isinstance(page, dict) else None
    return replace(request, query={**request.query, "cursor": str(cursor)}) if cursor else None


def list_request(path: str, filters: Mapping[str, object], limit: int = PAGE_LIMIT) -> ApiRequest:
    """``GET path?filter=...&limit=...``; filters left as None are not sent."""
    query = {key: _query_value(value) for key, value in filters.items() if value is not None}
    return ApiRequest("GET", path, {**query, "limit": str(limit)})


def instant(value: object) -> float | None:
    """A timestamp of the API as seconds since the epoch: RFC 3339 strings and plain numbers are both read."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _query_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def read_key_file(path: Path) -> str:
    """The API key kept in ``path`` (one line), or a clear error naming the file."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise IdlegridError(f"cannot read the API key from {path}: {exc.strerror}", code="bad_request") from None
    if not key:
        raise IdlegridError(f"{path} holds no API key", code="bad_request")
    return key


class ApiCalls(Generic[R]):
    """The API's calls by name, written once for both transports; ``R`` is what a transport's send returns."""

    def send(self, request: ApiRequest) -> R:
        raise NotImplementedError

    def health(self) -> R:
        return self.send(ApiRequest("GET", "/healthz"))

    def agent(self, agent_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/agents/{_segment(agent_id)}"))

    def command(self, command_id: str, *, wait_s: float | None = None) -> R:
        """One command; with ``wait_s``, answered once it is final or after that many seconds (at most 20, below the
        client's own 30 s for an answer)."""
        query = {"wait_s": f"{wait_s:g}"} if wait_s else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/commands/{_segment(command_id)}", query))

    def issue_command(self, agent_id: str, kind: str, spec: Mapping[str, Json], *, timeout_s: float | None = None) -> R:
        body: dict[str, Json] = {"agent_id": agent_id, "kind": kind, "spec": dict(spec)}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return self.send(ApiRequest("POST", f"{API_PREFIX}/commands", body=body))

    def create_join_token(self, provider: str, *, ttl_s: float | None = None) -> R:
        body: dict[str, Json] = {"provider": provider}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return self.send(ApiRequest("POST", f"{API_PREFIX}/tokens", body=body))

    def drain(self, agent_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/agents/{_segment(agent_id)}/drain"))

    # measured verification (docs/verification.md)
    def verify(self, agent_id: str, gpus: Sequence[str] = ()) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/agents/{_segment(agent_id)}/verify", body={"gpus": list(gpus)}))

    def verifications(self, agent_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/agents/{_segment(agent_id)}/verifications"))

    def undrain(self, agent_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/agents/{_segment(agent_id)}/undrain"))

    def revoke(self, agent_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/agents/{_segment(agent_id)}/revoke"))

    def repair_gpu(self, uuid: str) -> R:
        """A faulty GPU back in service (operator only)."""
        return self.send(ApiRequest("POST", f"{API_PREFIX}/gpus/{_segment(uuid)}/repair"))

    def rotate_signing_key(self) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/signing-keys/rotate"))

    def retire_signing_key(self, key_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/signing-keys/{_segment(key_id)}/retire"))

    # --- workloads ---

    def submit_workload(self, spec: Mapping[str, Json], *, account: str | None = None) -> R:
        """``spec``: the fields of a workload spec (docs/workloads.md); ``account``: for an operator's key only."""
        body: dict[str, Json] = dict(spec)
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("POST", f"{API_PREFIX}/workloads", body=body))

    def workload(self, workload_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/workloads/{_segment(workload_id)}"))

    def templates(self) -> R:
        """The launch templates (docs/templates.md): ``{"items": [{"name", "title", ..., "spec"}]}``."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/templates"))

    def template(self, name: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/templates/{_segment(name)}"))

    def workload_links(self, workload_id: str) -> R:
        """The workload's HTTPS links (docs/links.md): ``{"items": [{"port", "url", "public"}]}``."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/workloads/{_segment(workload_id)}/links"))

    def mint_link_token(self, workload_id: str, port: int, *, ttl_s: float | None = None) -> R:
        """A link token for one link, shown once: ``{"token", "url", "expires_at"}``."""
        body: dict[str, Json] = {} if ttl_s is None else {"ttl_s": ttl_s}
        return self.send(ApiRequest("POST", f"{API_PREFIX}/workloads/{_segment(workload_id)}/links/{port}/tokens", body=body))

    def cancel_workload(self, workload_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/workloads/{_segment(workload_id)}/cancel"))

    def explain_workload(self, workload_id: str) -> R:
        """Why a queued workload waits (409 conflict for one that is not queued)."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/workloads/{_segment(workload_id)}/explain"))

    def open_tunnel(self, workload_id: str, request: Mapping[str, Json]) -> R:
        """A grant to reach a replica's container (management/services/tunnels.py ``TunnelRequest`` fields)."""
        return self.send(ApiRequest("POST", f"{API_PREFIX}/workloads/{_segment(workload_id)}/tunnels", body=dict(request)))

    # --- accounts and API keys ---

    def whoami(self) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/whoami"))

    def create_account(self, account_id: str, role: str, **settings: Json) -> R:
        """``settings``: name, share, gpu_quota, tier_quotas, project_shares; those left None are not sent."""
        body = {"id": account_id, "role": role, **{k: v for k, v in settings.items() if v is not None}}
        return self.send(ApiRequest("POST", f"{API_PREFIX}/accounts", body=body))

    def account(self, account_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/accounts/{_segment(account_id)}"))

    def update_account(self, account_id: str, changes: Mapping[str, Json]) -> R:
        """Only the fields in ``changes`` change; ``{"gpu_quota": None}`` removes the limit."""
        return self.send(ApiRequest("PATCH", f"{API_PREFIX}/accounts/{_segment(account_id)}", body=dict(changes)))

    def set_password(self, account_id: str, password: str, *, current_password: str | None = None) -> R:
        """The account's console password; ``current_password`` when changing one's own (once one is set)."""
        body: dict[str, Json] = {"password": password}
        if current_password is not None:
            body["current_password"] = current_password
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/accounts/{_segment(account_id)}/password", body=body))

    def create_api_key(self, account_id: str, name: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/accounts/{_segment(account_id)}/keys", body={"name": name}))

    def revoke_api_key(self, key_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/keys/{_segment(key_id)}/revoke"))

    # --- the market ---

    def search_offers(self, query: str, *, sort: str | None = None, limit: int = 50, cursor: str | None = None) -> R:
        params = {"q": query, "limit": str(limit)} | ({"sort": sort} if sort else {}) | ({"cursor": cursor} if cursor else {})
        return self.send(ApiRequest("GET", f"{API_PREFIX}/offers", params))

    def rent_offer(self, offer_id: str, spec: Mapping[str, Json], *, account: str | None = None) -> R:
        body: dict[str, Json] = {"spec": dict(spec)}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("POST", f"{API_PREFIX}/offers/{_segment(offer_id)}/rent", body=body))

    def change_bid(self, workload_id: str, bid: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/workloads/{_segment(workload_id)}/bid", body={"bid": bid}))

    def balance(self, account_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/accounts/{_segment(account_id)}/balance"))

    def credit(self, account_id: str, amount: str, *, memo: str = "", key: str | None = None) -> R:
        """``key``: the same key again credits nothing more (the first credit's answer comes back)."""
        body: dict[str, Json] = {"amount": amount, "memo": memo}
        if key is not None:
            body["key"] = key
        return self.send(ApiRequest("POST", f"{API_PREFIX}/accounts/{_segment(account_id)}/credit", body=body))

    def ledger(self, account_id: str, *, after: int = 0, limit: int = 100, csv: bool = False, period: str = "") -> R:
        query = {"after": str(after), "limit": str(limit), "format": "csv" if csv else "json"}
        if period:
            query["period"] = period
        return self.send(ApiRequest("GET", f"{API_PREFIX}/accounts/{_segment(account_id)}/ledger", query))

    def statement(self, account_id: str, which: str, **query: str) -> R:
        """``which``: "spend" (a renter's, per workload), "earnings" (a provider's, per host) or "payouts"."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/accounts/{_segment(account_id)}/{which}", dict(query)))

    def rate_rental(self, rental_id: str, rating: int) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/rentals/{_segment(rental_id)}/rating", body={"rating": rating}))

    # --- monitoring: reports along dimensions (management/monitoring/reports.py) ---

    def report(self, kind: str, by: str, *, start: str | None = None, end: str | None = None, csv: bool = False) -> R:
        """``by``: e.g. "provider,day"; ``start``/``end``: unix seconds or ISO dates or times (UTC); CSV text with
        ``csv``, else the JSON report."""
        query = {"by": by, "format": "csv" if csv else "json"}
        query |= {name: value for name, value in (("from", start), ("to", end)) if value is not None}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/reports/{_segment(kind)}", query))

    # --- alerts (management/monitoring/): what fires, silences (the operator's), webhooks (each account its own) ---

    def alerts(self, *, rule: str | None = None, phase: str | None = None, severity: str | None = None) -> R:
        """Pending and firing alerts the key may see, and the recent transitions (newest first)."""
        query = {name: value for name, value in (("rule", rule), ("phase", phase), ("severity", severity)) if value}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/alerts", query))

    def alert_rules(self) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/alert-rules"))

    def put_alert_rule(self, name: str, rule: Mapping[str, Json]) -> R:
        """Add or replace the rule ``name`` (the operator); it applies from the next evaluation."""
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/alert-rules/{_segment(name)}", body=dict(rule)))

    def delete_alert_rule(self, name: str) -> R:
        """Remove an API-put rule; the rules file's rule of that name, if any, applies again."""
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/alert-rules/{_segment(name)}"))

    def silence(
        self,
        duration_s: float,
        *,
        rule: str | None = None,
        subject: str | None = None,
        labels: Mapping[str, str] | None = None,
        comment: str = "",
    ) -> R:
        """Hold back notifications of the alerts every given matcher matches, for ``duration_s``."""
        body: dict[str, Json] = {"duration_s": duration_s, "comment": comment, "labels": dict(labels or {})}
        body |= {name: value for name, value in (("rule", rule), ("subject", subject)) if value is not None}
        return self.send(ApiRequest("POST", f"{API_PREFIX}/silences", body=body))

    def silences(self, *, include_expired: bool = False) -> R:
        query = {"include_expired": "true"} if include_expired else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/silences", query))

    def expire_silence(self, silence_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/silences/{_segment(silence_id)}/expire"))

    def add_webhook(self, url: str) -> R:
        """The webhook, with its signing secret (shown in this answer only)."""
        return self.send(ApiRequest("POST", f"{API_PREFIX}/webhooks", body={"url": url}))

    def webhooks(self) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/webhooks"))

    def remove_webhook(self, webhook_id: str) -> R:
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/webhooks/{_segment(webhook_id)}"))

    # --- SSH (docs/ssh.md): an account's public keys, a workload's host keys ---

    def add_ssh_key(self, public_key: str, *, name: str = "", account: str | None = None) -> R:
        body: dict[str, Json] = {"public_key": public_key, "name": name}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("POST", f"{API_PREFIX}/ssh-keys", body=body))

    def ssh_keys(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/ssh-keys", query))

    def delete_ssh_key(self, key_id: str) -> R:
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/ssh-keys/{_segment(key_id)}"))

    def workload_ssh(self, workload_id: str) -> R:
        """The workload's SSH host keys, one per placed replica, with their known_hosts lines."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/workloads/{_segment(workload_id)}/ssh"))

    # --- money in (docs/payments.md): top-ups through the payment provider ---

    def create_topup(self, amount: str, *, account: str | None = None) -> R:
        body: dict[str, Json] = {"amount": amount}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("POST", f"{API_PREFIX}/billing/topups", body=body))

    def topups(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/billing/topups", query))

    def open_dispute(self, rental: str, reason: str, *, agent_id: str | None = None) -> R:
        body: dict[str, Json] = {"rental": rental, "reason": reason}
        if agent_id is not None:
            body["agent_id"] = agent_id
        return self.send(ApiRequest("POST", f"{API_PREFIX}/disputes", body=body))

    def dispute(self, dispute_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/disputes/{_segment(dispute_id)}"))

    def answer_dispute(self, dispute_id: str, answer: str) -> R:
        body: dict[str, Json] = {"answer": answer}
        return self.send(ApiRequest("POST", f"{API_PREFIX}/disputes/{_segment(dispute_id)}/answer", body=body))

    def resolve_dispute(self, dispute_id: str, resolution: str, *, amount: str | None = None, note: str = "") -> R:
        body: dict[str, Json] = {"resolution": resolution, "note": note}
        if amount is not None:
            body["amount"] = amount
        return self.send(ApiRequest("POST", f"{API_PREFIX}/disputes/{_segment(dispute_id)}/resolution", body=body))

    def connect_payout_account(self, *, account: str | None = None, return_url: str | None = None) -> R:
        body: dict[str, Json] = {}
        if account is not None:
            body["account"] = account
        if return_url is not None:
            body["return_url"] = body["refresh_url"] = return_url
        return self.send(ApiRequest("POST", f"{API_PREFIX}/billing/payout-account", body=body))

    def payout_account(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/billing/payout-account", query))

    def payouts(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/billing/payouts", query))

    def run_payouts(self) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/billing/payouts/run"))

    def reconcile_payouts(self) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/billing/payouts/reconcile"))

    def billing_settings(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/billing/settings", query))

    def save_payment_method(self, token: str, *, account: str | None = None) -> R:
        body: dict[str, Json] = {"payment_method": token}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/billing/payment-method", body=body))

    def set_spend_caps(self, caps: list[dict[str, Json]], *, account: str | None = None) -> R:
        """Replace the renter's spend caps: each ``{"window": "hour"|"month", "limit": "10", "hard": bool, "scope":
        "account"|"project", "project": name}``; an empty list removes them."""
        body: dict[str, Json] = {"caps": list(caps)}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/billing/caps", body=body))

    def set_auto_topup(self, threshold: str, amount: str, *, enabled: bool = True, account: str | None = None) -> R:
        body: dict[str, Json] = {"enabled": enabled, "threshold": threshold, "amount": amount}
        if account is not None:
            body["account"] = account
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/billing/auto-topup", body=body))

    # --- secrets (docs/storage.md): each account its own; a value is sent once and never read back ---

    def create_secret(self, name: str, value: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/secrets", body={"name": name, "value": value}))

    def secrets(self) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/secrets"))

    def delete_secret(self, name: str) -> R:
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/secrets/{_segment(name)}"))

    # --- serverless endpoints (docs/endpoints.md): a renter's own; invocation keys shown once ---

    def create_endpoint(self, spec: Mapping[str, Json]) -> R:
        """``spec``: an endpoint spec, with ``account`` for an operator's key."""
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints", body=dict(spec)))

    def endpoints(self, *, account: str | None = None) -> R:
        query = {"account": account} if account is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/endpoints", query))

    def endpoint(self, endpoint_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}"))

    def update_endpoint(self, endpoint_id: str, changes: Mapping[str, Json]) -> R:
        """``changes``: the spec's fields to change (``scaling`` field by field)."""
        return self.send(ApiRequest("PATCH", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}", body=dict(changes)))

    def delete_endpoint(self, endpoint_id: str) -> R:
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}"))

    def create_endpoint_key(self, endpoint_id: str, name: str = "") -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/keys", body={"name": name}))

    def endpoint_keys(self, endpoint_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/keys"))

    def revoke_endpoint_key(self, endpoint_id: str, key_id: str) -> R:
        path = f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/keys/{_segment(key_id)}/revoke"
        return self.send(ApiRequest("POST", path))

    # --- requests to an endpoint, RunPod's shape: the owner's API key, the operator's, or an invocation key ---

    def run_endpoint(self, endpoint_id: str, input: Json, *, webhook: str | None = None) -> R:
        """Queue a request: ``{"id", "status"}``."""
        body: dict[str, Json] = {"input": input} | ({"webhook": webhook} if webhook else {})
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/run", body=body))

    def run_endpoint_sync(self, endpoint_id: str, input: Json, *, wait_s: float = 90.0, webhook: str | None = None) -> R:
        """Queue a request and wait up to ``wait_s`` for its end (the client's own timeout must be longer)."""
        body: dict[str, Json] = {"input": input} | ({"webhook": webhook} if webhook else {})
        query = {"wait": str(round(wait_s * 1000))}
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/runsync", query, body))

    def endpoint_request(self, endpoint_id: str, request_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/status/{_segment(request_id)}"))

    def stream_endpoint_request(
        self, endpoint_id: str, request_id: str, *, after: int | None = None, wait_s: float | None = None
    ) -> R:
        """The partial outputs after ``after`` (None: after those this route answered already), waiting up to
        ``wait_s`` for one."""
        query = ({"after": str(after)} if after is not None else {}) | (
            {"wait": str(round(wait_s * 1000))} if wait_s is not None else {}
        )
        path = f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/stream/{_segment(request_id)}"
        return self.send(ApiRequest("GET", path, query))

    def cancel_endpoint_request(self, endpoint_id: str, request_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/cancel/{_segment(request_id)}"))

    def retry_endpoint_request(self, endpoint_id: str, request_id: str) -> R:
        return self.send(ApiRequest("POST", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/retry/{_segment(request_id)}"))

    def endpoint_health(self, endpoint_id: str) -> R:
        return self.send(ApiRequest("GET", f"{API_PREFIX}/endpoints/{_segment(endpoint_id)}/health"))

    # --- the market: providers' prices (amounts as decimal strings per GPU-hour, e.g. "2.50") ---

    def prices(self, *, provider: str | None = None) -> R:
        """A provider's own price records and the grid default; an operator's: everyone's, or ``provider``'s."""
        query = {"provider": provider} if provider is not None else {}
        return self.send(ApiRequest("GET", f"{API_PREFIX}/prices", query=query))

    def set_default_price(self, terms: Mapping[str, Json], *, provider: str | None = None) -> R:
        """``terms``: on_demand, min_bid, reserved_discount, max_duration_s; ``provider``: for an operator's key."""
        body: dict[str, Json] = dict(terms)
        if provider is not None:
            body["provider"] = provider
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/prices/default", body=body))

    def host_price(self, agent_id: str) -> R:
        """The price in force on a host and its source (host | provider | grid)."""
        return self.send(ApiRequest("GET", f"{API_PREFIX}/agents/{_segment(agent_id)}/price"))

    def set_host_price(self, agent_id: str, terms: Mapping[str, Json]) -> R:
        return self.send(ApiRequest("PUT", f"{API_PREFIX}/agents/{_segment(agent_id)}/price", body=dict(terms)))

    def clear_host_price(self, agent_id: str) -> R:
        return self.send(ApiRequest("DELETE", f"{API_PREFIX}/agents/{_segment(agent_id)}/price"))


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class ApiClient(ApiCalls[Json]):
    """Blocking client (urllib). ``list`` follows the cursor and returns every item in one call."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    @classmethod
    def with_key_file(cls, base_url: str, key_file: Path, *, timeout_s: float = REQUEST_TIMEOUT_S) -> ApiClient:
        return cls(base_url, read_key_file(key_file), timeout_s=timeout_s)

    def send(self, request: ApiRequest) -> Json:
        status, raw = self._exchange(request)
        return read_answer(request, status, raw)

    def raw(self, request: ApiRequest) -> bytes:
        """The body of a 2xx answer as bytes (a plain-text answer such as a workload's logs); ApiError otherwise."""
        status, raw = self._exchange(request)
        if not 200 <= status < 300:
            read_answer(request, status, raw)
        return raw

    def exchange(self, request: ApiRequest) -> tuple[int, Json]:
        """Status and decoded body, whatever the status (for callers that judge the status themselves)."""
        status, raw = self._exchange(request)
        try:
            return status, read_answer(request, status, raw)
        except ApiError as exc:
            return status, exc.body

    def get(self, path: str, **query: object) -> Json:
        return self.send(ApiRequest("GET", path, {k: _query_value(v) for k, v in query.items() if v is not None}))

    def pages(self, path: str, *, limit: int = PAGE_LIMIT, **filters: object) -> Iterator[list[Json]]:
        request: ApiRequest | None = list_request(path, filters, limit)
        while request is not None:
            page = self.send(request)
            yield list(page.get("items", []))
            request = next_page(request, page)

    def list(self, path: str, *, limit: int = PAGE_LIMIT, **filters: object) -> list[Json]:
        """Every item of a list resource, across all its pages, e.g. ``list("/api/v1/agents", state="ready")``."""
        return [item for page in self.pages(path, limit=limit, **filters) for item in page]

    def _exchange(self, request: ApiRequest) -> tuple[int, bytes]:
        attempt = 0
        while True:
            status, response_headers, raw = self._exchange_once(request)
            wait = retry_after_s(status, response_headers, attempt)
            if wait is None:
                return status, raw
            time.sleep(wait)
            attempt += 1

    def _exchange_once(self, request: ApiRequest) -> tuple[int, Mapping[str, str], bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        http = urllib.request.Request(request.url(self.base_url), data=request.payload(), method=request.method, headers=headers)
        try:
            with urllib.request.urlopen(http, timeout=self.timeout_s) as response:
                return response.status, dict(response.headers.items()), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise ApiUnreachable(self.base_url, getattr(exc, "reason", exc)) from None


class AsyncApiClient(ApiCalls[Awaitable[Json]]):
    """The same calls on aiohttp, for code already in an event loop. Close it (or use ``async with``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncApiClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, request: ApiRequest) -> Json:
        status, raw = await self._exchange(request)
        return read_answer(request, status, raw)

    async def list(self, path: str, *, limit: int = PAGE_LIMIT, **filters: object) -> list[Json]:
        items: list[Json] = []
        request: ApiRequest | None = list_request(path, filters, limit)
        while request is not None:
            page = await self.send(request)
            items.extend(page.get("items", []))
            request = next_page(request, page)
        return items

    async def _exchange(self, request: ApiRequest) -> tuple[int, bytes]:
        attempt = 0
        while True:
            status, headers, raw = await self._exchange_once(request)
            wait = retry_after_s(status, headers, attempt)
            if wait is None:
                return status, raw
            await asyncio.sleep(wait)
            attempt += 1

    async def _exchange_once(self, request: ApiRequest) -> tuple[int, Mapping[str, str], bytes]:
        import aiohttp

        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.connections),
            )
        data = request.payload()
        try:
            async with self._session.request(
                request.method,
                request.url(self.base_url),
                data=data,
                headers={"Content-Type": "application/json"} if data is not None else None,
            ) as response:
                return response.status, dict(response.headers.items()), await response.read()
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise ApiUnreachable(self.base_url, exc) from None
