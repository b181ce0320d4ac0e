"""Management's own aggregates, kept in the Master's one store through its plugin seam (master/store/plugin.py).

One module per aggregate: its repository's interface (a ``Protocol``), its SQLite and MongoDB implementations, its
key and order helpers, and its ``AggregatePlugin``. Management reaches a repository with the accessor below, given the
store (``port.store`` in a running Master, a ``Store`` in tests): ``ssh_key_repo(port.store).list(account=...)``.
The store builds it on first use and brings its quarantine, metrics and fence; its table or collection is made by a
step of the one migration sequence, master/store/migrations.py (docs/store.md, "Who owns what").
"""

from __future__ import annotations

from management.store.alerting import ALERT_RULES, SILENCES, WEBHOOKS, AlertRuleRepo, SilenceRepo, WebhookRepo
from management.store.billing import BILLING, BillingRepo
from management.store.disputes import DISPUTES, DisputeRepo
from management.store.endpoint_requests import ENDPOINT_REQUESTS, EndpointRequestRepo
from management.store.endpoints import ENDPOINT_KEYS, ENDPOINTS, EndpointKeyRepo, EndpointRepo
from management.store.fair_share import FAIR_SHARE, FairShareRepo
from management.store.ledger import LEDGER, LedgerRepo
from management.store.outputs import OUTPUTS, OutputRepo
from management.store.payments import PAYMENT_EVENTS, TOPUPS, PaymentEventRepo, TopupRepo
from management.store.payouts import PAYOUT_ACCOUNTS, PAYOUTS, PayoutAccountRepo, PayoutRepo
from management.store.prices import PRICES, PriceRepo
from management.store.rentals import RENTALS, RentalRepo
from management.store.ssh_keys import SSH_KEYS, SshKeyRepo
from management.store.workloads import WORKLOADS, WorkloadRepo
from master.store.kit import AggregatePlugin, Repositories

AGGREGATES: tuple[AggregatePlugin[object], ...] = (
    ALERT_RULES,
    SILENCES,
    WEBHOOKS,
    SSH_KEYS,
    OUTPUTS,
    PRICES,
    FAIR_SHARE,
    RENTALS,
    LEDGER,
    WORKLOADS,
    ENDPOINTS,
    ENDPOINT_KEYS,
    ENDPOINT_REQUESTS,
    TOPUPS,
    PAYMENT_EVENTS,
    BILLING,
    DISPUTES,
    PAYOUT_ACCOUNTS,
    PAYOUTS,
)


def payout_account_repo(store: Repositories) -> PayoutAccountRepo:
    return store.repository(PAYOUT_ACCOUNTS)


def payout_repo(store: Repositories) -> PayoutRepo:
    return store.repository(PAYOUTS)


def billing_repo(store: Repositories) -> BillingRepo:
    return store.repository(BILLING)


def attach(store: Repositories) -> None:
    """Build every management repository now, so each one's metric series exist from the start."""
    for plugin in AGGREGATES:
        store.repository(plugin)


def alert_rule_repo(store: Repositories) -> AlertRuleRepo:
    return store.repository(ALERT_RULES)


def silence_repo(store: Repositories) -> SilenceRepo:
    return store.repository(SILENCES)


def webhook_repo(store: Repositories) -> WebhookRepo:
    return store.repository(WEBHOOKS)


def output_repo(store: Repositories) -> OutputRepo:
    return store.repository(OUTPUTS)


def price_repo(store: Repositories) -> PriceRepo:
    return store.repository(PRICES)


def fair_share_repo(store: Repositories) -> FairShareRepo:
    return store.repository(FAIR_SHARE)


def rental_repo(store: Repositories) -> RentalRepo:
    return store.repository(RENTALS)


def ledger_repo(store: Repositories) -> LedgerRepo:
    return store.repository(LEDGER)


def workload_repo(store: Repositories) -> WorkloadRepo:
    return store.repository(WORKLOADS)


def ssh_key_repo(store: Repositories) -> SshKeyRepo:
    return store.repository(SSH_KEYS)


def endpoint_repo(store: Repositories) -> EndpointRepo:
    return store.repository(ENDPOINTS)


def endpoint_key_repo(store: Repositories) -> EndpointKeyRepo:
    return store.repository(ENDPOINT_KEYS)


def endpoint_request_repo(store: Repositories) -> EndpointRequestRepo:
    return store.repository(ENDPOINT_REQUESTS)


def topup_repo(store: Repositories) -> TopupRepo:
    return store.repository(TOPUPS)


def payment_event_repo(store: Repositories) -> PaymentEventRepo:
    return store.repository(PAYMENT_EVENTS)


def dispute_repo(store: Repositories) -> DisputeRepo:
    return store.repository(DISPUTES)


__all__ = [
    "AGGREGATES",
    "ALERT_RULES",
    "BILLING",
    "DISPUTES",
    "ENDPOINTS",
    "ENDPOINT_KEYS",
    "ENDPOINT_REQUESTS",
    "FAIR_SHARE",
    "LEDGER",
    "OUTPUTS",
    "PAYMENT_EVENTS",
    "PAYOUTS",
    "PAYOUT_ACCOUNTS",
    "PRICES",
    "RENTALS",
    "SILENCES",
    "SSH_KEYS",
    "TOPUPS",
    "WEBHOOKS",
    "WORKLOADS",
    "AlertRuleRepo",
    "BillingRepo",
    "EndpointKeyRepo",
    "EndpointRepo",
    "EndpointRequestRepo",
    "FairShareRepo",
    "LedgerRepo",
    "OutputRepo",
    "PaymentEventRepo",
    "PayoutAccountRepo",
    "PayoutRepo",
    "PriceRepo",
    "RentalRepo",
    "SilenceRepo",
    "SshKeyRepo",
    "TopupRepo",
    "WebhookRepo",
    "WorkloadRepo",
    "alert_rule_repo",
    "attach",
    "billing_repo",
    "dispute_repo",
    "endpoint_key_repo",
    "endpoint_repo",
    "endpoint_request_repo",
    "fair_share_repo",
    "ledger_repo",
    "output_repo",
    "payment_event_repo",
    "payout_account_repo",
    "payout_repo",
    "price_repo",
    "rental_repo",
    "silence_repo",
    "ssh_key_repo",
    "topup_repo",
    "webhook_repo",
    "workload_repo",
]
