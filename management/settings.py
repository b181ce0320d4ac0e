"""Management's settings in sections: what the composition root (management/app.py) gives the services and loops.

The operator writes one TOML file (and ``IDLEGRID_MASTER_*`` variables, and flags) for the whole Master process, read
into ``master.config.MasterConfig``; every key keeps its name and place there (docs/run-a-grid.md, deploy/). This
module is the one place that maps those keys to management's sections, so a service or loop takes its own section
and never reads the flat config:

- ``[scheduler]``: ``SchedulerSettings`` (management/workloads/runner.py) and the output collector's ``OutputSettings``
- ``[market]``: ``MarketRules``: the currency, the metering period, the low-balance warning, the rating rules
- ``[api]``: the per-key and per-account rate limits (``ApiSettings``)
- ``[alerts]``: the rules file, the evaluation period, the webhook notifier's limits
- ``[console]``: ``ConsoleSettings``, already a table of its own in the file (``[console]``)
- money in: ``PaymentSettings``, the payment provider, its secrets and the top-up bounds (docs/payments.md)

The sections are frozen: a running Master's settings change only by a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from management.api import ApiSettings
from management.market.money import parse_amount
from management.monitoring.notifier import NotifierSettings
from management.monitoring.settings import notifier_settings
from management.payments.payouts import PayoutSettings
from management.payments.topups import TopupLimits
from management.services.market import MarketRules, RatingRules
from management.services.outputs import OutputSettings
from management.workloads.runner import SchedulerSettings
from master.port import ConsoleSettings, LinkSettings, MasterConfig


@dataclass(frozen=True)
class SchedulerSection:
    scheduler: SchedulerSettings
    outputs: OutputSettings


@dataclass(frozen=True)
class AlertsSection:
    rules: Path | None  # a TOML file of [[rule]] tables; None: the shipped rules
    period_s: float
    notifier: NotifierSettings


@dataclass(frozen=True)
class PaymentSettings:
    """Money in (docs/payments.md): the provider ("" for none), its secrets (kept out of every repr and log line),
    where its SDK sends requests, how old a signed delivery may be, and the bounds of one top-up."""

    provider: str
    limits: TopupLimits
    stripe_api_key: str = field(default="", repr=False)
    stripe_webhook_secret: str = field(default="", repr=False)
    stripe_api_base: str = ""
    stripe_publishable_key: str = ""  # public by design (it is sent to every browser), so kept in the repr
    stripe_js_url: str = ""
    webhook_tolerance_s: int = 300
    catch_up_s: float = 300.0  # how often the provider's recent events are read (webhooks missed in an outage)
    catch_up_window_s: float = 3 * 86400.0  # how far back
    auto_topup_s: float = 60.0  # how often due auto top-ups are charged
    auto_topup_min_interval_s: float = 3600.0  # at most one auto top-up try per renter this often
    spend_cap_check_s: float = 30.0  # how often spend caps are read and acted on
    grace_s: float = 30.0  # work stopped by a hard spend cap: SIGTERM, this long, SIGKILL
    dispute_window_s: float = 7 * 86400.0  # a rental is disputed within this long of its end (docs/disputes.md)
    payouts: PayoutSettings = field(default_factory=PayoutSettings)  # money out

    @classmethod
    def of(cls, config: MasterConfig) -> PaymentSettings:
        limits = TopupLimits(parse_amount(config.topup_min), parse_amount(config.topup_max))
        if not 0 < limits.min_amount <= limits.max_amount:
            raise ConfigError(f"topup_min ({config.topup_min}) must be more than 0 and at most topup_max ({config.topup_max})")
        if config.payment_provider == "stripe" and not (config.stripe_api_key and config.stripe_webhook_secret):
            raise ConfigError(
                "payment_provider is stripe, so stripe_api_key and stripe_webhook_secret must be set "
                "(IDLEGRID_MASTER_STRIPE_API_KEY and IDLEGRID_MASTER_STRIPE_WEBHOOK_SECRET)"
            )
        return cls(
            provider=config.payment_provider,
            limits=limits,
            stripe_api_key=config.stripe_api_key,
            stripe_webhook_secret=config.stripe_webhook_secret,
            stripe_api_base=config.stripe_api_base,
            stripe_publishable_key=config.stripe_publishable_key,
            stripe_js_url=config.stripe_js_url,
            webhook_tolerance_s=config.stripe_webhook_tolerance_s,
            catch_up_s=config.payment_catch_up_s,
            catch_up_window_s=config.payment_catch_up_window_s,
            auto_topup_s=config.auto_topup_s,
            auto_topup_min_interval_s=config.auto_topup_min_interval_s,
            spend_cap_check_s=config.spend_cap_check_s,
            grace_s=config.preemption_grace_s,
            dispute_window_s=config.dispute_window_s,
            payouts=PayoutSettings(
                window_s=config.payout_window_s,
                period=config.payout_period,
                minimum=parse_amount(config.payout_min),
                check_s=config.payout_check_s,
                reconcile_s=config.payout_reconcile_s,
                reconcile_window_s=config.payout_reconcile_window_s,
            ),
        )


@dataclass(frozen=True)
class ManagementSettings:
    scheduler: SchedulerSection
    market: MarketRules
    api: ApiSettings
    alerts: AlertsSection
    console: ConsoleSettings
    state_path: Path  # the Master's state directory: the operator's token and the console's session key live there
    loop_restart_s: float  # a background loop that raised waits this long before it runs again
    links: LinkSettings  # HTTPS links to workloads' ports (docs/links.md)
    links_url: str  # where the links listener listens, what path links are under unless links.public_url says otherwise
    templates_dir: Path | None  # the operator's launch templates (docs/templates.md); None: the shipped ones only
    payments: PaymentSettings

    @classmethod
    def of(cls, config: MasterConfig) -> ManagementSettings:
        """The sections a Master's configuration gives (master/config.py documents each key)."""
        return cls(
            scheduler=SchedulerSection(SchedulerSettings.of(config), OutputSettings.of(config)),
            market=MarketRules(
                currency=config.currency,
                metering_period_s=config.metering_period_s,
                low_balance_warning_s=config.low_balance_warning_s,
                rating=RatingRules(
                    min_run_s=config.rating_min_run_s,
                    weight_unit=config.rating_weight_unit,
                    max_weight=config.rating_max_weight,
                    window_s=config.rating_window_s,
                ),
            ),
            api=ApiSettings(
                key_rate_per_s=config.api_key_rate_per_s,
                key_burst=config.api_key_burst,
                account_rate_per_s=config.api_account_rate_per_s,
                account_burst=config.api_account_burst,
                endpoint_rate_per_s=config.endpoint_rate_per_s,
                endpoint_burst=config.endpoint_burst,
            ),
            alerts=AlertsSection(
                rules=Path(config.alert_rules) if config.alert_rules else None,
                period_s=config.alert_period_s,
                notifier=notifier_settings(config),
            ),
            console=config.console,
            state_path=config.state_path,
            loop_restart_s=config.loop_restart_s,
            links=config.links,
            links_url=f"http://{config.host}:{config.links_port}",
            templates_dir=Path(config.templates_dir) if config.templates_dir else None,
            payments=PaymentSettings.of(config),
        )
