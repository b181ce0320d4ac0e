"""The alert settings people change through the API, kept in the store and applied to the running alert loop:
rules (an API-put rule replaces the file's rule of its name), silences and webhooks. The one writer of all three.

Who may do what is decided in management/access_control.py; here ``owner`` (None: the operator) narrows what a call sees:
a provider or renter lists and deletes only its own webhooks and sees only the alerts visibility.py lets it.

A webhook is refused at creation when its URL is not an http(s) URL with a host, carries credentials, or names a
target that is not public (webhook_targets.py; the operator's may be private when ``webhook_allow_private`` is set),
and when its account already has ``webhooks_per_account`` of them. Listing is paged.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from common.errors import Conflict, InvalidAlertSetting, NotFound
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.evaluator import AlertState, AlertTransition
from management.monitoring.notifier import NotifierSettings, ViewerOf, Webhook
from management.monitoring.observe import WIRED
from management.monitoring.rules import AlertRule
from management.monitoring.visibility import Viewer, visible
from management.monitoring.webhook_targets import url_refusal
from management.store import alert_rule_repo, silence_repo, webhook_repo
from master.port import AccountDirectory, AlertRuleRecord, ManagementStore, MasterConfig, RuleSpec, SilenceRecord, WebhookRecord

MAX_SILENCE_S = 90 * 86400.0


@dataclass(frozen=True, slots=True)
class RuleListing:
    rule: AlertRule
    source: str  # "file": the shipped (or configured) rules file; "api": put through the API


@dataclass(frozen=True, slots=True)
class AlertListing:
    active: list[AlertState]  # pending and firing now
    recent: list[AlertTransition]  # the latest transitions, newest first


def notifier_settings(config: MasterConfig) -> NotifierSettings:
    return NotifierSettings(
        concurrency=config.webhook_concurrency,
        per_account=config.webhook_account_concurrency,
        per_account_webhooks=config.webhooks_per_account,
        allow_private=config.webhook_allow_private,
        egress=config.egress_rule(),
    )


def account_viewer(accounts: AccountDirectory) -> ViewerOf:
    """What a webhook's owner may see as its account is now: None when it is gone or disabled."""

    async def viewer_of(hook: Webhook) -> Viewer | None:
        try:
            account = await accounts.get(hook.owner)
        except NotFound:
            return None
        return None if account.disabled else Viewer(account=account.id, role=account.role)

    return viewer_of


def rule_of(spec: RuleSpec, name: str) -> AlertRule:
    """``spec`` as a rule named ``name``; InvalidAlertSetting names the field that is wrong."""
    if "name" in spec and spec["name"] != name:
        raise InvalidAlertSetting(f"name {spec['name']!r} in the body differs from the rule's path name {name!r}")
    try:
        return msgspec.convert({**spec, "name": name}, AlertRule)
    except msgspec.ValidationError as exc:
        raise InvalidAlertSetting(f"rule {name!r}: {exc}") from exc


class AlertSettings:
    def __init__(self, store: ManagementStore, loop: AlertLoop, file_rules: list[AlertRule], clock: Callable[[], float]) -> None:
        self._store = store
        self._loop = loop
        self._file_rules = {rule.name: rule for rule in file_rules}
        self._api_rules: dict[str, AlertRule] = {}
        self._clock = clock
        self._loaded = False
        self._creating = asyncio.Lock()  # one webhook made at a time, so concurrent requests cannot pass the cap together

    async def load(self) -> None:
        """Read the stored settings into the loop (once: the composition root, management/app.py, calls it before
        the first call below)."""
        if self._loaded:
            return
        for record in await alert_rule_repo(self._store).list():
            try:
                self._api_rules[record.name] = rule_of(record.spec, record.name)
            except InvalidAlertSetting:
                continue  # a rule this version no longer accepts: left in the store, listed nowhere
        for silence in await silence_repo(self._store).list(active_at=self._clock()):
            self._loop.silences.put(silence)
        for webhook in await webhook_repo(self._store).list():
            self._loop.notifier.webhooks[webhook.id] = _hook(webhook)
        self._loaded = True
        self._apply()

    def _apply(self) -> None:
        self._loop.replace_rules([*({**self._file_rules, **self._api_rules}).values()])

    # --- rules ------------------------------------------------------------------------------------

    async def rules(self) -> list[RuleListing]:
        merged = {name: RuleListing(rule, "file") for name, rule in self._file_rules.items()}
        merged |= {name: RuleListing(rule, "api") for name, rule in self._api_rules.items()}
        return [merged[name] for name in sorted(merged)]

    async def put_rule(self, name: str, spec: RuleSpec, by: str) -> AlertRule:
        rule = rule_of(spec, name)
        if rule.metric not in WIRED:
            raise InvalidAlertSetting(f"metric {rule.metric!r} is not one the Master watches: {', '.join(sorted(WIRED))}")
        record = AlertRuleRecord(name=name, spec=msgspec.to_builtins(rule), updated_at=self._clock(), updated_by=by)
        await alert_rule_repo(self._store).put(record)
        self._api_rules[name] = rule
        self._apply()
        return rule

    async def delete_rule(self, name: str) -> RuleListing | None:
        """Remove an API-put rule; the file's rule of that name, if any, applies again (returned)."""
        if name not in self._api_rules:
            if name in self._file_rules:
                raise Conflict(f"rule {name!r} comes from the rules file; put a rule of that name to change it")
            raise NotFound(f"no alert rule {name!r}")
        await alert_rule_repo(self._store).delete(name)
        del self._api_rules[name]
        self._apply()
        shipped = self._file_rules.get(name)
        return None if shipped is None else RuleListing(shipped, "file")

    # --- alerts -----------------------------------------------------------------------------------

    async def alerts(
        self, viewer: Viewer, *, rule: str | None = None, phase: str | None = None, severity: str | None = None
    ) -> AlertListing:
        severities = {r.name: r.severity for r in self._loop.rules}

        def wanted(name: str, its_phase: str, labels: Mapping[str, str]) -> bool:
            return (
                visible(labels, viewer)
                and (rule is None or name == rule)
                and (phase is None or its_phase == phase)
                and (severity is None or severities.get(name) == severity)
            )

        active = [s for s in self._loop.states.values() if wanted(s.rule, s.phase, s.labels)]
        active.sort(key=lambda s: (s.since, s.rule, s.subject))
        recent = [t for t in reversed(self._loop.recent) if wanted(t.rule, t.phase, t.labels)]
        return AlertListing(active=active, recent=recent)

    # --- silences ---------------------------------------------------------------------------------

    async def create_silence(
        self,
        *,
        by: str,
        duration_s: float,
        rule: str | None,
        subject: str | None,
        labels: Mapping[str, str],
        comment: str,
    ) -> SilenceRecord:
        if not 0 < duration_s <= MAX_SILENCE_S:
            raise InvalidAlertSetting(f"duration_s must be more than 0 and at most {MAX_SILENCE_S:g} seconds")
        if rule is None and subject is None and not labels:
            raise InvalidAlertSetting("a silence needs a matcher: rule, subject or labels (it would silence everything)")
        now = self._clock()
        silence = SilenceRecord(
            id="sil-" + secrets.token_hex(6),
            expires_at=now + duration_s,
            created_at=now,
            created_by=by,
            rule=rule,
            subject=subject,
            labels=dict(labels),
            comment=comment,
        )
        await silence_repo(self._store).put(silence)
        self._loop.silences.put(silence)
        return silence

    async def silences(self, *, include_expired: bool = False) -> list[SilenceRecord]:
        return await silence_repo(self._store).list(active_at=None if include_expired else self._clock())

    async def expire_silence(self, silence_id: str) -> SilenceRecord:
        now = self._clock()
        found = [s for s in await silence_repo(self._store).list(active_at=now) if s.id == silence_id]
        if not found:
            raise NotFound(f"no silence {silence_id!r} in force")
        ended = msgspec.structs.replace(found[0], expires_at=now)
        await silence_repo(self._store).put(ended)
        self._loop.silences.put(ended)
        return ended

    # --- webhooks ---------------------------------------------------------------------------------

    async def create_webhook(self, url: str, *, owner: str, role: str) -> WebhookRecord:
        """A new webhook; its secret is in the record returned, and shown nowhere else afterwards."""
        async with self._creating:
            return await self._create_webhook(url, owner=owner, role=role)

    async def _create_webhook(self, url: str, *, owner: str, role: str) -> WebhookRecord:
        settings = self._loop.notifier.settings
        why = url_refusal(url, allow_private=settings.allow_private and role == "operator", rule=settings.egress)
        if why is not None:
            raise InvalidAlertSetting(why)
        held = len(await webhook_repo(self._store).list(owner=owner))
        if held >= settings.per_account_webhooks:
            raise Conflict(
                f"account {owner!r} has {held} webhooks, the most an account may (webhooks_per_account); delete one first"
            )
        record = WebhookRecord(
            id="wh-" + secrets.token_hex(6),
            url=url,
            secret=secrets.token_urlsafe(32),
            owner=owner,
            role=role,
            created_at=self._clock(),
        )
        await webhook_repo(self._store).put(record)
        self._loop.notifier.webhooks[record.id] = _hook(record)
        return record

    async def webhooks(self, *, owner: str | None, after: tuple[float, str] | None = None, limit: int) -> list[WebhookRecord]:
        """Up to ``limit`` webhooks (of ``owner``, or every one), by creation then id, from just after ``after``."""
        listed = await webhook_repo(self._store).list(owner=owner)
        if after is not None:
            listed = [w for w in listed if (w.created_at, w.id) > after]
        return listed[:limit]

    async def delete_webhook(self, webhook_id: str, *, owner: str | None) -> None:
        mine = [w for w in await webhook_repo(self._store).list(owner=owner) if w.id == webhook_id]
        if not mine:
            raise NotFound(f"no webhook {webhook_id!r}")
        await webhook_repo(self._store).delete(webhook_id)
        self._loop.notifier.webhooks.pop(webhook_id, None)


def _hook(record: WebhookRecord) -> Webhook:
    return Webhook(
        id=record.id, url=record.url, secret=record.secret, owner=record.owner, role=record.role, created_at=record.created_at
    )
