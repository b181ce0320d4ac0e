"""Alert rules, alerts, silences and webhooks (management/monitoring/), as the API and the console ask for them.

``owner``/``role`` as the API's auth decided: None and "operator" see everything; a provider or renter its own. The
rules are evaluated by ``loop`` (an ``AlertLoop``), which runs where the composition root (management/app.py) started it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from management.monitoring.alert_loop import AlertLoop
from management.monitoring.rules import AlertRule
from management.monitoring.settings import AlertListing, AlertSettings, RuleListing
from management.monitoring.visibility import Viewer
from management.services.models import KeyText, Page, page_of
from master.port import RuleSpec, SilenceRecord, WebhookRecord


class WebhookKey(msgspec.Struct, array_like=True, frozen=True):
    created_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)]
    id: KeyText


class AlertsService:
    def __init__(self, settings: AlertSettings, loop: AlertLoop) -> None:
        self.settings = settings  # what the API changes, stored and put into the loop
        self.loop = loop

    async def alert_rules(self) -> list[RuleListing]:
        return await self.settings.rules()

    async def put_alert_rule(self, name: str, spec: RuleSpec, *, by: str) -> AlertRule:
        return await self.settings.put_rule(name, spec, by)

    async def delete_alert_rule(self, name: str) -> RuleListing | None:
        return await self.settings.delete_rule(name)

    async def list_alerts(
        self, *, owner: str | None, role: str, rule: str | None = None, phase: str | None = None, severity: str | None = None
    ) -> AlertListing:
        viewer = Viewer(account=owner or "", role="operator" if owner is None else role)
        return await self.settings.alerts(viewer, rule=rule, phase=phase, severity=severity)

    async def create_silence(
        self,
        *,
        by: str,
        duration_s: float,
        rule: str | None = None,
        subject: str | None = None,
        labels: Mapping[str, str] | None = None,
        comment: str = "",
    ) -> SilenceRecord:
        return await self.settings.create_silence(
            by=by, duration_s=duration_s, rule=rule, subject=subject, labels=labels or {}, comment=comment
        )

    async def list_silences(self, *, include_expired: bool = False) -> list[SilenceRecord]:
        return await self.settings.silences(include_expired=include_expired)

    async def expire_silence(self, silence_id: str) -> SilenceRecord:
        return await self.settings.expire_silence(silence_id)

    async def create_webhook(self, url: str, *, owner: str, role: str) -> WebhookRecord:
        return await self.settings.create_webhook(url, owner=owner, role=role)

    async def list_webhooks(self, *, owner: str | None, after: WebhookKey | None = None, limit: int) -> Page[WebhookRecord]:
        after_key = None if after is None else (after.created_at, after.id)
        found = await self.settings.webhooks(owner=owner, after=after_key, limit=limit + 1)
        return page_of(found, limit, lambda w: WebhookKey(w.created_at, w.id))

    async def delete_webhook(self, webhook_id: str, *, owner: str | None) -> None:
        await self.settings.delete_webhook(webhook_id, owner=owner)
