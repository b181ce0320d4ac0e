"""The composition root of the Master's process: settings -> services, loops and the HTTP app, in one place.

``compose(master, settings)`` builds every management part once, over one Master: the workload book, the price book,
the market, the scheduling loop, the output collector, the alert loop, and the ``Services`` the API and the console
call (management/services/). ``MasterServer`` runs it with the Master and the HTTP API (the daemon's ``serve_master``
and the tests alike); ``api_app`` serves the same over an existing Master for tests that need no relay link.

State is loaded once, here, before the first call is served (``Composition.load``): providers' prices, the open
workloads, the market (balances, open rentals, the fee window), the alert settings, the endpoints' request bounds and
their open requests. No service loads lazily.

Order, the same every time (a standby Master does steps 2 and 3 only once elected, docs/ha.md):

1. the Master starts (store, registry, relay link);
2. the operator's API key is written on the first start, then the state is loaded, in ``Composition.state`` order;
3. the loops start in ``Composition.loops`` order: the market (offer feed and metering), the output collector, the
   scheduler, the links' idle sweep, the alert loop (which observes all the others), the endpoint requests' webhooks
   (delivered once a request ends), the endpoint requests' book (from here on the Master hands it the endpoint
   workers' calls, and its sweep applies TTLs and timeouts), the load-balanced endpoints' readiness probes (their
   pool: docs/endpoints.md, "Load-balanced mode"), the endpoints' autoscaler (docs/endpoints.md, "The autoscaler's
   shell"), the payments' catch-up, the auto top-up and the spend caps' watch (docs/payments.md);
4. the HTTP API listens.

Stopping runs it backwards: the API refuses new changes (503) and lets those under way finish, the loops stop in
reverse order (the endpoints' autoscaler first, then the readiness probes, whose held requests are answered 503, then
the endpoint requests' book: workers' calls are answered 503,
which they retry; then the webhooks still pending are dropped; then alerts,
scheduler, output collector, market: nothing is placed once metering has stopped), the Master
drains its relay links and closes its store, and the HTTP server closes last (reads are served until then).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from common.errors import Conflict
from common.http import HttpServer
from common.loopwatch import watching
from management.api import ApiSettings, Handler, build_app, error_response
from management.api.invocation import API_GATE_KEY
from management.endpoints.pool import BalancedPool
from management.endpoints.requests import RequestBook
from management.endpoints.scaler import EndpointScaler
from management.endpoints.webhooks import RequestWebhooks
from management.launch.templates import TemplateCatalog
from management.links.endpoint_proxy import readiness
from management.links.proxy import links_app
from management.market.market import Market
from management.market.prices import PriceBook, grid_default_of
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.billing_signals import failed_auto_topup_readings, spend_cap_readings
from management.monitoring.market_series import MarketSeries
from management.monitoring.notifier import WebhookNotifier
from management.monitoring.observe import FleetObserver
from management.monitoring.report_source import ReportSource
from management.monitoring.rules import load_rules
from management.monitoring.settings import AlertSettings, account_viewer
from management.onboarding.service import Onboarding
from management.payments.caps import CapBlocks
from management.payments.provider import PaymentProvider
from management.services import Services
from management.services.accounts import AccountsService
from management.services.alerts import AlertsService
from management.services.billing import BillingService
from management.services.billing_settings import BillingSettingsService
from management.services.disputes import DisputeService
from management.services.endpoint_requests import EndpointRequestsService
from management.services.endpoints import EndpointsService
from management.services.grid import GridService
from management.services.hosts import HostsService
from management.services.links import LinksService, link_key
from management.services.market import MarketService
from management.services.outputs import OutputCollector
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
from management.settings import ManagementSettings, PaymentSettings
from management.store import (
    attach,
    billing_repo,
    dispute_repo,
    endpoint_key_repo,
    endpoint_repo,
    endpoint_request_repo,
    output_repo,
    payment_event_repo,
    payout_account_repo,
    payout_repo,
    price_repo,
    rental_repo,
    ssh_key_repo,
    topup_repo,
)
from management.views.endpoint_requests import request_status_body
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop
from master.accounts import BOOTSTRAP_ACCOUNT
from master.config import MasterConfig
from master.master import Master
from master.port import MasterPort, WorkloadSpec

log = logging.getLogger(__name__)

OPERATOR_TOKEN_FILE = "operator.token"
# How long a stopping Master lets API calls already accepted finish (a command is stored, then sent).
REQUEST_DRAIN_S = 10.0
RETRY_AFTER_S = 5
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LEADER_HEADER = "Idlegrid-Leader"  # a standby's answer: the leader's API URL (docs/ha.md)
STEPPED_DOWN_EXIT = 75  # the exit status of a Master that lost the lease (EX_TEMPFAIL): its supervisor restarts it


class ApiGate:
    """Refuses API calls (503, Retry-After) once the Master stops, and lets the changes under way finish.

    A call answered 202 has stored what it did before answering, so letting those finish and
    turning the rest away with a status that says "retry" is what makes a stop lose nothing.
    Reads are refused too: the store they read is about to close. /healthz and /metrics still answer.
    """

    def __init__(self) -> None:
        self.open = True
        self._under_way = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def middleware(self) -> Middleware:
        @web.middleware
        async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith("/api/"):
                return await handler(request)
            return await self.serve(request, handler)

        return gate

    async def serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """An API call let through (a change counted as under way until answered), or 503 once stopping (the
        invocation path's gate too: management/api/invocation.py)."""
        if not self.open:
            response = error_response(503, "shutting_down", "the Master is shutting down; retry in a few seconds")
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
        if request.method in READ_ONLY_METHODS:
            return await handler(request)
        self._under_way += 1
        self._idle.clear()
        try:
            return await handler(request)
        finally:
            self._under_way -= 1
            if not self._under_way:
                self._idle.set()

    async def close(self, timeout_s: float) -> None:
        """Refuse new calls; wait (up to ``timeout_s``) for the changes under way."""
        self.open = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("stopping with API calls still under way", extra={"calls": self._under_way})


class StandbyGate:
    """A Master that does not lead (docs/ha.md) answers every route but /healthz with 503 ``not_leader``, naming the
    leader's API URL in the body (``error.leader``) and in an ``Idlegrid-Leader`` header ("" / absent when no leader is
    known yet), with Retry-After: a client retries there, or here in a moment. Outermost: nothing else runs first."""

    def __init__(self, master: MasterPort) -> None:
        self._master = master

    def middleware(self) -> Middleware:
        @web.middleware
        async def standby(request: web.Request, handler: Handler) -> web.StreamResponse:
            leadership = self._master.leadership
            if leadership is None or self._master.serves() or request.path == "/healthz":
                return await handler(request)
            leader = leadership.leader_api_url()
            if leadership.leads():
                message = "this Master has just been elected and is loading its state; retry in a few seconds"
            elif leader:
                message = f"this Master is {leadership.role.value}, not the leader: the leader is {leader}"
            else:
                message = (
                    f"this Master is {leadership.role.value}, not the leader; no leader is known yet: retry in a few seconds"
                )
            response = web.json_response(
                {
                    "error": {
                        "code": "not_leader",
                        "message": message,
                        "leader": leader,
                    }
                },
                status=503,
            )
            response.headers["Retry-After"] = "1"
            if leader:
                response.headers[LEADER_HEADER] = leader
            return response

        return standby


class State(Protocol):
    """A part whose state is read from the store once, before the first call."""

    def load(self) -> Awaitable[object]: ...


class Background(Protocol):
    """A loop that runs while the Master serves."""

    def start(self) -> None: ...

    def stop(self) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Composition:
    """Everything management runs over one Master: the services, the state to load and the loops to run."""

    services: Services
    state: tuple[tuple[str, State], ...]  # loaded in this order
    loops: tuple[tuple[str, Background], ...]  # started in this order, stopped in the reverse one
    market_series: MarketSeries  # the market's Prometheus series, registered once by whoever serves /metrics

    async def load(self) -> None:
        for _, part in self.state:
            await part.load()

    def start(self) -> None:
        for _, loop in self.loops:
            loop.start()

    async def stop(self) -> None:
        for _, loop in reversed(self.loops):
            await loop.stop()


def compose(master: MasterPort, settings: ManagementSettings | None = None) -> Composition:
    """Build every management part over ``master``, once: who writes what is decided here (one writer each)."""
    settings = settings or ManagementSettings.of(master.config)
    attach(master.store)  # management's own aggregates in the Master's store (management/store/)
    # The one writer of workload records, shared with the scheduling loop, the market and the output collector.
    book = WorkloadBook(
        master.store,
        master,
        policy=master.policy,
        egress=master.config.egress_rule(),
        gang_overlay=bool(master.config.overlay.lighthouses),
    )
    hosts = HostsService(master, book)
    # The one writer of providers' prices; the offer index and the scheduler read (and subscribe to) the same book.
    prices = PriceBook(price_repo(master.store), grid_default_of(master.config), time.time, owner_of=hosts.provider_of)
    market = Market(master, book, prices)
    cap_blocks = CapBlocks()  # the spend cap watch's word on who may start paid work, read by the scheduler
    scheduler = SchedulerLoop(
        master,
        book,
        settings.scheduler.scheduler,
        prices=prices.price,
        funded=market.funded,
        budget=market.budget,
        period_s=settings.market.metering_period_s,
        capped=cap_blocks.reason,
        under_review=market.reliability.under_review,
    )
    market_service = MarketService(master, book, market, settings.market, fit_check=scheduler.never_fits)
    workloads = WorkloadsService(master, book, scheduler, market_service)
    ssh_keys = SshKeysService(master, ssh_key_repo(master.store), workloads.get_workload)

    async def check_worker(account: str, spec: WorkloadSpec) -> None:  # an endpoint's worker, as a workload's submit
        await book.check(account, spec)
        why = await scheduler.never_fits(account, spec)
        if why is not None:
            raise Conflict(f"this endpoint's workers can never run on this grid: {why}")

    endpoints = EndpointsService(
        master.secrets, endpoint_repo(master.store), endpoint_key_repo(master.store), check_worker=check_worker
    )
    # Each ended request's webhook, delivered off the book's path through the grid's egress rule.
    request_webhooks = RequestWebhooks(request_status_body, egress=master.config.egress_rule())
    # The one writer of endpoint requests; the Master hands it the endpoint workers' calls while it runs.
    requests = RequestBook(
        endpoint_request_repo(master.store),
        limits_of=endpoints.limits_of,
        serve=master.serve_worker_calls,
        on_end=request_webhooks.notify,
    )
    endpoint_requests = EndpointRequestsService(requests, endpoints, endpoint_request_repo(master.store), request_webhooks)
    # Each endpoint's workers, as workloads of its account: the autoscaler's decisions carried out every second.
    # Load-balanced endpoints' workers, asked their readiness path through the links' tunnels (set once links exist).
    balancer = BalancedPool(book.open_workloads, endpoints, lambda *ask: balanced_probe(*ask))
    scaler = EndpointScaler(
        book, requests, endpoints, rental_repo(master.store), grace_s=settings.scheduler.scheduler.grace_s, pool=balancer
    )
    endpoints.scale_of = scaler.status  # what the last tick found, in the endpoint's answer
    endpoint_requests.spend_of = scaler.spent_24h  # an endpoint's day's cost, on its console page
    tunnels = RenterAccess(master, workloads.get_workload, output_repo(master.store))
    output_settings = settings.scheduler.outputs
    outputs = OutputCollector(
        master,
        book,
        output_repo(master.store),
        lambda kept: tunnels.read_output(kept, limit=output_settings.limit_bytes),
        output_settings,
        restart_s=settings.loop_restart_s,
    )
    tunnels.collect = outputs.collect  # a renter's request reads a pending output at once
    tunnels.ssh_fingerprints = ssh_keys.fingerprints  # an ssh ticket lets in the caller's keys (docs/ssh.md)
    observer = FleetObserver(master, book.open_workloads, market.meter.balance_cover_s)
    alert_loop = AlertLoop(
        observer,
        load_rules(settings.alerts.rules),
        notifier=WebhookNotifier(settings=settings.alerts.notifier, viewer_of=account_viewer(master.accounts)),
        period_s=settings.alerts.period_s,
    )
    alert_settings = AlertSettings(master.store, alert_loop, list(alert_loop.rules), time.time)
    accounts = AccountsService(master)
    links = LinksService(
        workloads.get_workload,
        tunnels,
        accounts,
        settings.links,
        public_url=settings.links_url,
        key=link_key(settings.state_path),
    )
    endpoints.url_of = lambda record: links.endpoint_url(record.id) if record.spec.load_balanced else None

    async def balanced_probe(workload_id: str, port: int, path: str, timeout_s: float) -> bool:
        return await readiness(links, workload_id, port, path, timeout_s)

    provider = payment_provider(settings.payments)
    topups = TopupService(
        master,
        provider,
        topup_repo(master.store),
        payment_event_repo(master.store),
        market.ledger,
        currency=settings.market.currency,
        limits=settings.payments.limits,
        catch_up_s=settings.payments.catch_up_s,
        catch_up_window_s=settings.payments.catch_up_window_s,
        restart_s=settings.loop_restart_s,
    )

    def balance_left(renter: str, now: float) -> int:
        funds = market.ledger.funds(renter)
        return funds.available + funds.held - market.meter.unbilled(renter, now)

    billing_settings = BillingSettingsService(
        master,
        provider,
        billing_repo(master.store),
        topups,
        balance_left,
        currency=settings.market.currency,
        limits=settings.payments.limits,
        auto_topup_s=settings.payments.auto_topup_s,
        min_interval_s=settings.payments.auto_topup_min_interval_s,
        restart_s=settings.loop_restart_s,
    )
    spend_caps = SpendCapWatch(
        master,
        billing_repo(master.store),
        rental_repo(master.store),
        market.meter,
        book,
        cap_blocks,
        currency=settings.market.currency,
        check_s=settings.payments.spend_cap_check_s,
        grace_s=settings.payments.grace_s,
        restart_s=settings.loop_restart_s,
    )
    # A renter's spend caps and failed auto top-ups are alerts too, seen by the operator and by that renter.
    currency = settings.market.currency
    observer.spend_caps = lambda now: spend_cap_readings(spend_caps.all_readings(), currency)
    observer.failed_auto_topups = lambda now: failed_auto_topup_readings(topups.failed_auto_topups())
    disputes = DisputeService(
        master,
        dispute_repo(master.store),
        rental_repo(master.store),
        market.ledger,
        window_s=settings.payments.dispute_window_s,
    )
    payouts = PayoutService(
        master,
        provider,
        payout_account_repo(master.store),
        payout_repo(master.store),
        market.ledger,
        currency=settings.market.currency,
        settings=settings.payments.payouts,
        restart_s=settings.loop_restart_s,
    )
    alert_loop.observer.unreconciled = payouts.unreconciled  # the payout reconciliation's alert (docs/payments.md)
    services = Services(
        accounts=accounts,
        hosts=hosts,
        grid=GridService(master),
        workloads=workloads,
        prices=PricesService(master, prices, hosts, settings.market.currency),
        market=market_service,
        billing=BillingService(market_service),
        telemetry=TelemetryService(master, hosts, workloads),
        alerts=AlertsService(alert_settings, alert_loop),
        reports=ReportsService(ReportSource(master), settings.market.currency),
        tunnels=tunnels,
        onboarding=Onboarding(master),
        verification=VerificationService(master),
        links=links,
        templates=TemplatesService(TemplateCatalog.load(settings.templates_dir)),
        ssh_keys=ssh_keys,
        secrets=SecretsService(master),
        endpoints=endpoints,
        endpoint_requests=endpoint_requests,
        balancer=balancer,
        topups=topups,
        billing_settings=billing_settings,
        spend_caps=spend_caps,
        disputes=disputes,
        payouts=payouts,
    )
    series = MarketSeries(book.counts, market.meter.open_rentals, market.ledger.balances, currency=settings.market.currency)
    return Composition(
        services=services,
        state=(
            ("prices", prices),
            ("workloads", book),
            ("market", market),
            ("alert settings", alert_settings),
            ("endpoints", endpoints),
            ("endpoint requests", requests),
        ),
        loops=(
            ("market", market),
            ("outputs", outputs),
            ("scheduler", scheduler),
            ("links", links),
            ("alerts", alert_loop),
            ("request webhooks", request_webhooks),
            ("endpoint requests", requests),
            ("endpoint readiness", balancer),
            ("endpoint scaler", scaler),
            ("payments", topups),
            ("auto top-up", billing_settings),
            ("spend caps", spend_caps),
            ("payouts", payouts),
        ),
        market_series=series,
    )


def payment_provider(settings: PaymentSettings) -> PaymentProvider | None:
    """The payment provider's adapter the settings name; None when the grid takes no payments."""
    if settings.provider == "stripe":
        # Imported only by a Master that takes payments: the SDK costs every other process 0.2 s of imports.
        from management.payments.stripe_provider import StripeProvider

        return StripeProvider(
            settings.stripe_api_key,
            settings.stripe_webhook_secret,
            api_base=settings.stripe_api_base,
            tolerance_s=settings.webhook_tolerance_s,
            publishable_key=settings.stripe_publishable_key,
            js_url=settings.stripe_js_url,
        )
    return None


def http_app(master: MasterPort, composition: Composition, settings: ManagementSettings) -> web.Application:
    """The API and the console over ``composition``, its market series beside the fleet's on /metrics."""
    master.metrics.registry.register(composition.market_series)
    return build_app(master, composition.services, settings.api, console=settings.console, state_dir=settings.state_path)


def api_app(master: MasterPort, api: ApiSettings | None = None) -> web.Application:
    """The HTTP app over a Master that runs elsewhere (tests with no relay link): composed here, its state loaded as
    the app starts, its loops not run (a test drives them)."""
    settings = ManagementSettings.of(master.config)
    if api is not None:
        settings = _with_api(settings, api)
    composition = compose(master, settings)
    app = http_app(master, composition, settings)

    async def load_state(_: web.Application) -> None:
        await composition.load()

    app.on_startup.append(load_state)
    return app


def _with_api(settings: ManagementSettings, api: ApiSettings) -> ManagementSettings:
    return replace(settings, api=api)


class MasterServer:
    """The Master plus its HTTP API; ``start``/``stop`` for tests and the daemon alike."""

    def __init__(self, config: MasterConfig, api_settings: ApiSettings | None = None) -> None:
        self.config = config
        self.settings = ManagementSettings.of(config)
        if api_settings is not None:
            self.settings = _with_api(self.settings, api_settings)
        self.api_settings = self.settings.api
        self.master = Master(config)
        self.composition = compose(self.master, self.settings)  # its loops run while this server serves
        self.services = self.composition.services
        self._http: HttpServer | None = None
        self._links_http: HttpServer | None = None
        self.gate = ApiGate()
        self.api_port = 0
        self.links_port = 0

    async def start(self) -> None:
        if self.master.leadership is not None:
            await self._start_standby()
            return
        await self.master.start()
        await self._serve()
        await self._start_http()

    async def _start_standby(self) -> None:
        """High availability: listen (API and relay link) as a standby; serve once elected (``_serve``). A standby
        loads nothing: the leader goes on changing the state, which this Master reads when it takes over."""
        self.master.when_elected(self._serve)
        await self._start_http()
        advertised = self.config.advertise_host or self.config.host
        await self.master.start_standby(f"http://{advertised}:{self.api_port}")

    async def _serve(self) -> None:
        """What the API needs beyond the Master: the operator's key, the state loaded (once), the loops started."""
        await self._ensure_operator_token()
        await self.composition.load()
        self.composition.start()

    async def _start_http(self) -> None:
        app = http_app(self.master, self.composition, self.settings)
        app.middlewares.append(self.gate.middleware())  # innermost: a caller is authenticated before it is told 503
        app[API_GATE_KEY] = self.gate  # the invocation path's gate (it goes past the chain's)
        app.middlewares.insert(0, StandbyGate(self.master).middleware())  # outermost: a standby authenticates no one
        self._http = HttpServer(
            app,
            self.config.host,
            self.config.api_port,
            head_timeout_s=self.api_settings.header_timeout_s,
            access_log=None,
            keepalive_timeout=self.api_settings.idle_timeout_s,
            max_line_size=self.api_settings.max_request_line_bytes,
        )
        await self._http.start()
        self.api_port = self._http.port
        log.info("management API listening", extra={"url": self.api_url})
        await self._start_links()

    async def _start_links(self) -> None:
        """The links' own listener (docs/links.md): never the API's origin, so a link's scripts cannot read the console."""
        app = links_app(self.composition.services)
        app.middlewares.insert(0, StandbyGate(self.master).middleware())  # a standby serves no link either
        self._links_http = HttpServer(
            app,
            self.config.host,
            self.config.links_port,
            head_timeout_s=self.api_settings.header_timeout_s,
            access_log=None,
            keepalive_timeout=self.api_settings.idle_timeout_s,
            max_line_size=self.api_settings.max_request_line_bytes,
        )
        await self._links_http.start()
        self.links_port = self._links_http.port
        self.composition.services.links.listening_at(self.links_url)  # a free port (0) is known only now
        log.info("links listening", extra={"url": self.links_url})

    async def stop(self) -> None:
        """Graceful (the module's order, backwards): new changes get 503, those accepted finish, the loops stop in
        reverse order, the Master drains its links and flushes, then the API closes (reads are served until then)."""
        await self.gate.close(REQUEST_DRAIN_S)
        await self.composition.stop()
        await self.master.stop()
        if self._links_http is not None:
            await self._links_http.stop()
        if self._http is not None:
            await self._http.stop()

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.api_port}"

    @property
    def links_url(self) -> str:
        return f"http://{self.config.host}:{self.links_port}"

    @property
    def operator_token_file(self) -> Path:
        return self.config.state_path / OPERATOR_TOKEN_FILE

    async def _ensure_operator_token(self) -> None:
        """First start: mint an operator API key and leave it, 0600, where the operator can read it."""
        path = self.operator_token_file
        if path.exists():
            return
        key = (await self.master.create_account_key(BOOTSTRAP_ACCOUNT, "bootstrap operator")).key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
        log.info("operator API key written", extra={"path": str(path)})


async def serve_master(config: MasterConfig) -> None:
    server = MasterServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"idlegrid master: API {server.api_url}  links {server.links_url}  relay link {server.master.link_url}", flush=True)
    leadership = server.master.leadership
    deposed = asyncio.ensure_future(leadership.deposed.wait() if leadership is not None else asyncio.Event().wait())
    stopping = asyncio.ensure_future(stop.wait())
    async with watching("master", server.master.metrics.registry):
        await asyncio.wait({deposed, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if leadership is not None and leadership.deposed.is_set():
        log.error("stepped down (%s); exiting so the supervisor starts this Master again as a standby", leadership.deposed_reason)
        await server.stop()
        raise SystemExit(STEPPED_DOWN_EXIT)
    log.info("shutting down: refusing API changes, draining relay links")
    await server.stop()
