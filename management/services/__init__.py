"""The services: what the API and the console may ask of the grid, one module per resource, gathered in ``Services``.

A handler (management/api/) or a page (management/console/) parses a request, makes one call on one service and
renders what comes back; it never reaches into the Master itself. The services are the only part of ``management/``
that composes Master calls. They are built once, by the composition root (management/app.py), which also loads the
state they read (the workload book, prices, the market, alert settings) before the first call: no service loads
lazily.

| service | resource |
|---|---|
| ``accounts`` | accounts, API keys, passwords, the console's sign-in, the audit trail |
| ``hosts`` | hosts (agents) and their GPUs, drain, revoke, repair, the fleet at a glance |
| ``grid`` | commands, events, join tokens, command-signing keys, tiers, revoked certificates, health |
| ``workloads`` | renters' workloads: submit, read, list, explain, cancel, the console's overview |
| ``prices`` | providers' prices and the price in force on a host |
| ``market`` | offers, rentals, ratings, funds and the ledger |
| ``billing`` | what a renter spent over time (the console's billing page) |
| ``topups`` | money in: renters' top-ups through the payment provider, and its signed webhook (docs/payments.md) |
| ``billing_settings`` | a renter's saved payment method, auto top-up and spend caps; the auto top-up loop (docs/payments.md) |
| ``payouts`` | money out: providers' payout accounts, the payout run of matured earnings, the reconciliation (docs/payments.md) |
| ``spend_caps`` | the spend caps at work: spending per cap window, alerts, hard caps stopping work (docs/payments.md) |
| ``disputes`` | disputes of rentals: evidence, hold, the provider's answer, the operator's resolution (docs/disputes.md) |
| ``telemetry`` | telemetry history by GPU, host and workload; a host's live samples |
| ``alerts`` | alert rules, alerts, silences, webhooks |
| ``reports`` | reports along dimensions |
| ``tunnels`` | renter access: tunnels to a workload's containers through the relays, logs, kept output |
| ``onboarding`` | what a provider's host fetches to join the grid |
| ``secrets`` | an account's own secrets: create (value taken once), list by name, delete |
| ``verification`` | measured GPU verification: a run on the operator's request, each GPU's result and history |
| ``templates`` | launch templates: the catalog and the workload spec each launches |
| ``links`` | HTTPS links to workloads' http ports: their URLs, link tokens, who may pass, the tunnels they use |
| ``ssh_keys`` | accounts' SSH public keys, which the platform's SSH end lets in (docs/ssh.md) |
| ``endpoints`` | renters' serverless endpoints and their invocation keys (docs/endpoints.md) |
| ``endpoint_requests`` | requests to those endpoints: run, run and wait, status, stream, cancel, retry, health |
| ``balancer`` | load-balanced endpoints' workers (ready or not, outstanding requests) and held requests (their URL) |

Lists are keyset-paginated (``models.Page``); ownership filters (``owner``: the account a call is limited to, as the
API's auth decided) are applied in the services, so a provider's page never holds another account's hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

from management.endpoints.pool import BalancedPool
from management.onboarding.service import Onboarding
from management.services.accounts import AccountsService
from management.services.alerts import AlertsService
from management.services.billing import BillingService
from management.services.billing_settings import BillingSettingsService
from management.services.disputes import DisputeService
from management.services.endpoint_requests import EndpointRequestsService
from management.services.endpoints import EndpointsService
from management.services.grid import GridService
from management.services.hosts import HostsService
from management.services.links import LinksService
from management.services.market import MarketService
from management.services.payouts import PayoutService
from management.services.prices import PricesService
from management.services.reports import ReportsService
from management.services.secrets import SecretsService
from management.services.spend_caps import SpendCapWatch
from management.services.ssh_keys import SshKeysService
from management.services.telemetry import TelemetryService
from management.services.templates import TemplatesService
from management.services.topups import TopupService
from management.services.tunnels import RenterAccess
from management.services.verification import VerificationService
from management.services.workloads import WorkloadsService

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    accounts: AccountsService
    hosts: HostsService
    grid: GridService
    workloads: WorkloadsService
    prices: PricesService
    market: MarketService
    billing: BillingService
    telemetry: TelemetryService
    alerts: AlertsService
    reports: ReportsService
    tunnels: RenterAccess
    onboarding: Onboarding
    verification: VerificationService
    links: LinksService
    templates: TemplatesService
    ssh_keys: SshKeysService
    secrets: SecretsService
    endpoints: EndpointsService
    endpoint_requests: EndpointRequestsService
    balancer: BalancedPool
    topups: TopupService
    billing_settings: BillingSettingsService
    spend_caps: SpendCapWatch
    disputes: DisputeService
    payouts: PayoutService
