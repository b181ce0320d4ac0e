"""The Master's settings; every value has a default that works for a local run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from common.config import TomlTable, load_config
from common.egress import EgressRule
from master.overlay import OverlaySettings


class ConsoleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The web console (management/console/, docs/console.md), served by the Master beside the API."""

    enabled: bool = True
    # A session lasts this long from sign-in, whatever is done with it; then the console asks to sign in again.
    session_lifetime_s: Annotated[float, msgspec.Meta(ge=60, le=30 * 86400)] = 12 * 3600.0
    # The session cookie's Secure flag: "auto" sets it when the request came over https (the Master behind a TLS
    # proxy that says so, or served over TLS itself); "always" for a deployment that is only ever reached over https.
    cookie_secure: Literal["auto", "always", "never"] = "auto"
    # Sign-in attempts allowed per account and per client address: this many at once, refilled at this rate.
    signin_burst: Annotated[int, msgspec.Meta(ge=1)] = 5
    signin_per_minute: Annotated[float, msgspec.Meta(gt=0)] = 5.0


DEFAULT_LINKS_PORT = 7300


class LinkSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """HTTPS links to workloads' http ports (management/links/, docs/links.md), served by the Master."""

    # Links are served on a listener of their own, never on the API's and the console's (docs/links.md): a link's
    # pages come from the renter's image and must not run in the console's origin. Its port (0: any free one);
    # unset: 7300, or any free one when the API's port is 0 too (a test's Master), so such Masters never collide.
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    # A wildcard domain whose names all reach the links listener (``*.links.example.net``): each link is then
    # ``<scheme>://<workload>-<port>.<domain>/``, an origin of its own. "": links are paths on ``public_url``.
    domain: str = ""
    # How people reach the links listener (``https://links.grid.example.net``, or the Master's name with the links
    # port); "": ``http://<host>:<port>``, where it listens. Never the console's address: the API answers no link.
    public_url: str = ""
    scheme: Literal["https", "http"] = "https"  # of wildcard-domain links (http only for a local grid)
    # Connections to one link's container at once (each a stream in the link's one tunnel); more wait their turn.
    connections_per_link: Annotated[int, msgspec.Meta(ge=1, le=256)] = 32
    # Each link's bytes per second each way through the Master (0: only the relay's per-tunnel cap). A link's bytes
    # pass through the Master's own process, which also carries every control frame: this keeps one busy link to a
    # small share of it (python -m bench link, bench/README.md).
    bytes_per_s: Annotated[int, msgspec.Meta(ge=0)] = 16 * 1024 * 1024
    # A link's tunnel unused this long is closed (its slot on the host given back); the next request opens another.
    idle_close_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # How long a link token minted for a browser (the console's "Open") lets it in.
    browser_token_s: Annotated[float, msgspec.Meta(ge=60, le=30 * 86400)] = 12 * 3600.0
    # The longest a link token minted through the API may last.
    max_token_s: Annotated[float, msgspec.Meta(ge=60, le=366 * 86400)] = 30 * 86400.0


class MasterConfig(msgspec.Struct, kw_only=True):
    state_dir: str = ".idlegrid/master"
    store_url: str = ""  # empty: SQLite at <state_dir>/master.db
    host: str = "127.0.0.1"
    link_port: int = 7100  # WebSocket endpoint for Access relays (mutual TLS)
    api_port: int = 7000  # management HTTP API
    # How often agents send a heartbeat and a telemetry sample (positive, at most an hour: see common/wire.py).
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0
    telemetry_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    missed_heartbeats: int = 3
    command_timeout_s: float = 300.0
    # A workload's create on a host that lacks its image (the host's hello lists what it has) may take this much longer:
    # the agent pulls the image first (docs/images.md; its own image_pull_timeout_s bounds the pull).
    image_pull_allowance_s: float = 1800.0
    token_ttl_s: float = 3600.0
    agent_cert_s: float = 7 * 86400.0
    # An agent gets at most one new certificate per this many seconds (capped at a tenth of agent_cert_s),
    # so a misbehaving agent cannot mint certificates in a loop.
    agent_renew_min_interval_s: float = 600.0
    tier_policy: str = ""  # empty: the built-in policy
    server_names: list[str] = msgspec.field(default_factory=lambda: ["localhost"])
    server_ips: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.1"])
    rollup_flush_s: float = 15.0
    # A flush's writes are spread over about this long (master/batches.py): a minute of 10,000 agents' telemetry is
    # 80,000 rollups, and written as a burst it slowed every command of a busy machine for 10-13 s. 0: the duty alone.
    flush_spread_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # Heartbeats change only an agent's last_seen and uptime in memory; those are written this often (state changes
    # at once). 10,000 agents rewritten every rollup_flush_s cost the Master as much store time as all telemetry; a
    # restarted Master gives every agent a full heartbeat timeout before judging silence, so nothing rests on it.
    heartbeat_flush_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # What one host may report: a hello listing more GPUs is refused and nothing of it registered.
    max_gpus_per_host: Annotated[int, msgspec.Meta(ge=1)] = 16
    # Each agent's budget of event reports (AgentEvent frames): a token bucket holding this many events and
    # bytes, refilled over report_window_s. What is over is dropped, counted, and noted once per window.
    report_events_per_window: Annotated[int, msgspec.Meta(ge=1)] = 60
    report_bytes_per_window: Annotated[int, msgspec.Meta(ge=1)] = 256 * 1024
    report_window_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # A burst of relay links opening or closing is announced to agents as one directory, this long after the first.
    relay_directory_coalesce_s: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    # Overload (docs/master.md, "Intake lanes"): bytes of control, of hellos and of telemetry each relay link's intake
    # holds (hellos apart, so that a storm's do not stop the reading of the results behind them);
    # past telemetry_coalesce_bytes an agent's newest heartbeat or sample replaces its waiting one. Agents are told
    # to report up to max_report_slowdown times less often while telemetry is shed, and new agent sessions are
    # admitted at admit_agents_per_s (shared among the relays; 0: no limit), admit_burst at once.
    intake_control_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024)] = 8 * 1024 * 1024
    intake_telemetry_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024)] = 4 * 1024 * 1024
    intake_admission_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024)] = 64 * 1024 * 1024
    telemetry_coalesce_bytes: Annotated[int, msgspec.Meta(ge=0)] = 1024 * 1024
    max_report_slowdown: Annotated[float, msgspec.Meta(ge=1, le=64)] = 8.0
    admit_agents_per_s: Annotated[float, msgspec.Meta(ge=0)] = 400.0
    admit_burst: Annotated[int, msgspec.Meta(ge=1)] = 400
    # Whether GPUs of hosts whose isolation is only a sandbox (the process runtime) are offered to renters. Off by
    # default: a sandboxed process shares the host's kernel, files and /proc with the provider's own processes.
    offer_sandboxed_hosts: bool = False
    # --- measured verification (master/verifier.py, docs/verification.md) ---
    verify_enabled: bool = True  # challenge GPUs on join, on a driver change and every verify_period_s when idle
    verify_period_s: Annotated[float, msgspec.Meta(gt=0)] = 86400.0
    verify_loop_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0  # how often due GPUs and expired challenges are looked at
    verify_retry_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0  # after a refusal (the GPU was rented), asked again
    verify_max_concurrent: Annotated[int, msgspec.Meta(ge=1)] = 32
    verify_simulated: bool = False  # challenge simulated GPUs on schedule too (else only when an operator asks)
    verify_n: Annotated[int, msgspec.Meta(ge=1, le=16384)] = 1024  # real GPUs: the challenge's shape
    verify_k: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 4096
    verify_rounds: Annotated[int, msgspec.Meta(ge=1)] = 4
    verify_allowance_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0  # on top of the claimed model's computing time
    # The rounds form (agents that answer it): sized per claimed model so its healthy card computes for
    # verify_work_ratio * verify_round_allowance_s (docs/verification.md)
    # the real kernel's tiles (agent/benchmark/cuda.py round_batch): n a multiple of 64, k of 32; k at most 1,024 so
    # that FP32 accumulation of the 8-bit entries' products stays exact (common/challenge.py ROUND_MAX_K)
    verify_round_n: Annotated[int, msgspec.Meta(ge=64, le=16384, multiple_of=64)] = 512
    verify_round_k: Annotated[int, msgspec.Meta(ge=32, le=1024, multiple_of=32)] = 1024
    verify_work_ratio: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    verify_round_allowance_s: Annotated[float, msgspec.Meta(ge=0)] = 3.0
    verify_sim_target_s: Annotated[float, msgspec.Meta(gt=0)] = 0.5  # a simulated card of its claimed model takes this
    verify_sim_allowance_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # The scheduler (management/scheduler/): it runs on every change that can matter, and at least this often.
    scheduler_period_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    # Gangs' private networks (master/overlay.py, docs/overlay.md): off until lighthouses are listed.
    overlay: OverlaySettings = msgspec.field(default_factory=OverlaySettings)
    # A preempted (or cancelled) workload's containers get this long between SIGTERM and SIGKILL.
    preemption_grace_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 30.0
    # A workload container's output is kept after the container is deleted (management/services/outputs.py): its last
    # output_limit_bytes bytes (the agent keeps as much, by its own setting), for output_retention_s after it ended.
    output_limit_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 * 1024 * 1024)] = 8 * 1024 * 1024
    output_retention_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    # A host unseen this long has its workloads placed elsewhere (shorter gaps, a relay failover, are ridden out).
    requeue_offline_after_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    # "binpack" fills hosts already in use first (whole hosts stay free for large gangs); "spread" the emptiest first.
    placement: Literal["binpack", "spread"] = "binpack"
    # Fair share: an account's GPU-seconds count half after this long (Slurm's default half-life is 7 days).
    fair_share_half_life_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    # A background loop that raised waits this long before it runs again.
    loop_restart_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # --- GPU faults (master/faults.py) ---
    # Xid errors after which a GPU is faulty until an operator repairs it (NVIDIA's Xid catalog):
    #  48: double-bit (uncorrectable) ECC error           63: ECC page retirement / row remapping event recorded
    #  64: ECC page retirement / row remapping failed      74: NVLink error
    #  79: GPU has fallen off the bus                      92: high single-bit ECC error rate
    #  94: contained ECC error (application killed)        95: uncontained ECC error (GPU reset needed)
    fatal_xids: list[int] = msgspec.field(default_factory=lambda: [48, 63, 64, 74, 79, 92, 94, 95])
    # A GPU at or above this temperature for overheat_samples telemetry samples in a row is faulty; it is healthy
    # again after cool_samples samples in a row below it (hysteresis: a card at the limit does not flap).
    max_temperature_c: Annotated[float, msgspec.Meta(gt=0)] = 90.0
    overheat_samples: Annotated[int, msgspec.Meta(ge=1)] = 3
    cool_samples: Annotated[int, msgspec.Meta(ge=1)] = 3
    # A GPU sample dated further than this before or after the Master's clock is set aside (master/telemetry.py
    # plausible_gpu): a relay replays what it buffered while the Master was away, late by minutes, and agents' clocks
    # drift a little; a date far outside is no reading of now, and one beyond the store's integers stopped every flush.
    sample_max_age_s: Annotated[float, msgspec.Meta(gt=0)] = 86400.0
    sample_max_ahead_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    # --- Prometheus (master/metrics.py, docs/monitoring.md) ---
    # Also export series per GPU (utilization, memory, temperature by uuid): three series a GPU, so only for small
    # fleets or a Prometheus sized for it; the fleet's series by tier, region and model are always there.
    metrics_per_gpu: bool = False
    # --- the market (management/market/, docs/market.md) ---
    # Prices of hosts whose provider set none, per GPU-hour, as decimal strings (0: free, as on a shared cluster).
    # default_min_bid "" rents such hosts on demand only.
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}\Z")] = "USD"
    default_price: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z")] = "0"
    default_min_bid: Annotated[str, msgspec.Meta(pattern=r"^([0-9]{1,9}(\.[0-9]{1,6})?)?\Z")] = "0"
    # Running rentals are charged in entries this far apart (and at their end); a Master killed loses at most one.
    metering_period_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 60.0
    # The platform's share of every charge; hosts whose reliability over reliable_window_s is at least
    # reliable_threshold pay reliable_fee_percent instead.
    platform_fee_percent: Annotated[float, msgspec.Meta(ge=0, le=100)] = 10.0
    reliable_fee_percent: Annotated[float, msgspec.Meta(ge=0, le=100)] = 5.0
    reliable_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.97
    reliable_window_s: Annotated[float, msgspec.Meta(gt=0)] = 30 * 86400.0
    # A running rental holds this long of its cost from its renter's balance (at least one period; docs/payments.md,
    # "Holds"): its provider is paid for every metered second even when the balance runs out, and the rest returns.
    rental_hold_s: Annotated[float, msgspec.Meta(ge=1, le=30 * 86400)] = 3600.0
    # Automatic SLA credits (docs/disputes.md): a run ended through its host credits its renter, on top of the refund,
    # price x GPUs x min(downtime x sla_credit_percent / 100, sla_credit_cap_s) / 3600 from that host's provider, the
    # downtime being the seconds from the host's last heartbeat to the run's end as the meter saw it, at least
    # sla_min_downtime_s (a start the host failed: that minimum). sla_credit_percent 0 credits nothing.
    sla_credit_percent: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 200
    sla_min_downtime_s: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 600.0
    sla_credit_cap_s: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] = 3600.0
    # A host whose rental completion rate over reliable_window_s (the share of its rentals that did not end through it)
    # falls below completion_rate_threshold, with at least completion_min_rentals counted, is not offered until an
    # operator reviews it (docs/disputes.md, "Completion rates"); 0 turns the gate off.
    completion_rate_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.8
    completion_min_rentals: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 5
    # A renter disputes an ended rental within this long of its end (docs/disputes.md); the disputed amount is held off
    # the provider's earnings until an operator resolves it.
    dispute_window_s: Annotated[float, msgspec.Meta(gt=0, le=365 * 86400)] = 7 * 86400.0
    # A renter whose balance will not cover this long of its running rentals is warned (an event, the console).
    low_balance_warning_s: Annotated[float, msgspec.Meta(gt=0)] = 3600.0
    # A renter's rating counts in a host's reputation only for a rental that ran at least rating_min_run_s and was paid
    # (when it cost anything), weighted 1 plus 1 per rating_weight_unit paid on the host, at most rating_max_weight; and
    # at most one per renter and host in rating_window_s (docs/market-prices.md, "Ratings"). Cheap ratings once sank
    # hosts: 20 one-star ratings for 0.01 in all.
    rating_min_run_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    rating_weight_unit: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z")] = "1"
    rating_max_weight: Annotated[int, msgspec.Meta(ge=1, le=100)] = 4
    rating_window_s: Annotated[float, msgspec.Meta(ge=0)] = 30 * 86400.0
    # --- money in (management/payments/, docs/payments.md) ---
    # The payment provider renters top up through: "" takes no payments (an operator credits balances by hand).
    payment_provider: Literal["", "stripe"] = ""
    # Stripe's secret API key and the signing secret of the grid's webhook endpoint on Stripe: secrets, best given as
    # IDLEGRID_MASTER_STRIPE_API_KEY and IDLEGRID_MASTER_STRIPE_WEBHOOK_SECRET rather than in the file; never logged.
    stripe_api_key: str = ""
    stripe_webhook_secret: str = ""
    # Where the SDK sends its requests; "": Stripe's own API (https://api.stripe.com). The tests' localstripe sets it.
    stripe_api_base: str = ""
    # The console's top-up and card form (docs/payments.md, "Topping up on the console"): Stripe's publishable key
    # (pk_...; "" offers no card form: renters then use the API or CLI) and where Stripe.js is loaded from (Stripe's
    # own origin; the tests' localstripe serves a stand-in). The billing page's Content-Security-Policy allows these.
    stripe_publishable_key: str = ""
    stripe_js_url: str = "https://js.stripe.com/v3/"
    # A webhook delivery signed longer ago than this is refused (replayed deliveries must be re-signed by Stripe).
    stripe_webhook_tolerance_s: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 300
    # Every payment_catch_up_s the Master reads the provider's top-up events of the last payment_catch_up_window_s from
    # its API and acts on those no webhook brought (an outage): each event is acted on once, whichever way it came.
    payment_catch_up_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    payment_catch_up_window_s: Annotated[float, msgspec.Meta(ge=60, le=30 * 86400)] = 3 * 86400.0
    # The least and the most one top-up may be, as decimal strings of the grid's currency.
    topup_min: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z")] = "5"
    topup_max: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z")] = "10000"
    # Auto top-ups (docs/payments.md): every auto_topup_s the Master charges renters whose balance fell below their
    # threshold, each at most once per auto_topup_min_interval_s (RunPod: once an hour), paid or declined.
    auto_topup_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    auto_topup_min_interval_s: Annotated[float, msgspec.Meta(ge=60, le=30 * 86400)] = 3600.0
    # Spend caps (docs/payments.md): every spend_cap_check_s the Master reads each capped renter's spending; a hard cap
    # reached stops its running work (with preemption_grace_s) and keeps new paid work from starting.
    spend_cap_check_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    # --- money out (docs/payments.md, "Payouts") ---
    # Earnings younger than payout_window_s (the dispute window) wait; what matured is paid once per payout_period
    # (a UTC day, ISO week or month) to each onboarded provider, when at least payout_min (in the grid's currency).
    payout_window_s: Annotated[float, msgspec.Meta(ge=0, le=90 * 86400)] = 7 * 86400.0
    payout_period: Literal["day", "week", "month"] = "week"
    payout_min: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z")] = "10"
    # How often the payout run looks for a period not paid yet, and how often (and how far back) the ledger's payouts
    # are reconciled with the payment provider's transfers.
    payout_check_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 3600.0
    payout_reconcile_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] = 86400.0
    payout_reconcile_window_s: Annotated[float, msgspec.Meta(ge=86400, le=400 * 86400)] = 35 * 86400.0
    # --- renter access (tunnels through the relays: common/tunnel.py) ---
    # Both ends of a tunnel must reach the relay within this long of the ticket's issue.
    tunnel_ticket_s: Annotated[float, msgspec.Meta(ge=1, le=600)] = 30.0
    # Each tunnel's bandwidth each way, bytes a second; 0 leaves it to the relay's own setting.
    tunnel_bytes_per_s: Annotated[int, msgspec.Meta(ge=0)] = 0
    # --- the management API ---
    # Each API key may make this many management API requests a second sustained, and this many at once; over
    # that it is answered 429 with Retry-After (management/api/ratelimit.py). Other keys are not affected.
    api_key_rate_per_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    api_key_burst: Annotated[int, msgspec.Meta(ge=1)] = 40
    # Each account, all its keys together, may make this many requests a second sustained and this many at once:
    # minting keys buys no more (management/api/ratelimit.py).
    api_account_rate_per_s: Annotated[float, msgspec.Meta(gt=0)] = 40.0
    api_account_burst: Annotated[int, msgspec.Meta(ge=1)] = 80
    # Each endpoint, all its invocation keys together, may make this many calls of its request routes a second
    # sustained and this many at once (management/api/ratelimit.py): an endpoint's clients are no API key's.
    endpoint_rate_per_s: Annotated[float, msgspec.Meta(gt=0)] = 2000.0
    endpoint_burst: Annotated[int, msgspec.Meta(ge=1)] = 4000
    # Keys an account may hold that are not revoked (master/accounts.py); creating one more answers 409.
    api_keys_per_account: Annotated[int, msgspec.Meta(ge=1)] = 20
    # --- alerts (management/monitoring/, docs/monitoring.md) ---
    alert_rules: str = ""  # a TOML file of [[rule]] tables; empty: the shipped rules (management/monitoring/rules.toml)
    alert_period_s: Annotated[float, msgspec.Meta(gt=0)] = 15.0  # how often the rules are evaluated
    # Webhooks (management/monitoring/notifier.py): an account has at most this many; all deliveries together make
    # at most ``webhook_concurrency`` attempts at once, one account's at most ``webhook_account_concurrency``.
    webhooks_per_account: Annotated[int, msgspec.Meta(ge=1)] = 10
    webhook_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 16
    webhook_account_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 2
    # Webhooks go to public addresses only; true lets the operator's own reach private and loopback ones (a receiver
    # inside the operator's network). Never another account's.
    webhook_allow_private: bool = False
    # Targets on private addresses renters may name at submit (docs/security.md, "Egress"): a workload's storage
    # endpoint or image registry that is, or resolves to, a loopback, private, link-local or other non-public address
    # is refused unless allowed here by name, "HOST" (any port) or "HOST:PORT" (e.g. ["minio.lan:9000"]). Each host
    # checks again with its own provider's list (the agent's egress_allow) when it connects.
    egress_allow: list[str] = []
    log_level: str = "info"
    # --- telemetry history (master/history.py, docs/monitoring.md) ---
    # One-minute rollups are kept this long, hourly ones (downsampled from them by the "history" loop) this long.
    history_minute_retention_s: Annotated[float, msgspec.Meta(ge=3600)] = 7 * 86400.0
    history_hourly_retention_s: Annotated[float, msgspec.Meta(ge=3600)] = 90 * 86400.0
    # How often the history loop looks for finished hours to downsample and for rollups past retention.
    history_period_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # --- high availability (master/leadership.py, docs/ha.md) ---
    # Several Masters on one MongoDB database: the one holding the leader lease serves, the others stand by.
    ha: bool = False
    node_id: str = ""  # this Master's name in the lease, unique among them; "" -> "<hostname>:<api_port>"
    # The host relays and API callers reach this Master at, in the URLs the lease names; "" -> host.
    advertise_host: str = ""
    lease_ttl_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # a leader that stops renewing is replaced this long after
    lease_renew_s: Annotated[float, msgspec.Meta(gt=0)] = 3.0  # how often the leader renews, and a standby tries
    # The leader stops writing this long before its lease lapses: the clock skew between Masters must stay under it.
    lease_margin_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # --- onboarding (management/onboarding/): the agent's package served at /dist/ ---
    # A wheel of idlegrid to serve as it is; "" builds one from the source this Master runs (a checkout) at first ask.
    agent_wheel: str = ""
    # --- the console ---
    console: ConsoleSettings = msgspec.field(default_factory=ConsoleSettings)
    # --- HTTPS links to workloads' ports and launch templates (docs/links.md, docs/templates.md) ---
    links: LinkSettings = msgspec.field(default_factory=LinkSettings)
    # A directory of the operator's own launch templates (*.toml), added to (or replacing by name) the shipped ones.
    templates_dir: str = ""

    def egress_rule(self) -> EgressRule:
        """Where the Master lets renters' targets be (webhooks, and storage endpoints and registries at submit):
        public addresses, and those the operator allows by name (ConfigError for an entry that is not HOST[:PORT])."""
        return EgressRule.allowing(self.egress_allow, who="the operator", setting="egress_allow in the Master's config")

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    @property
    def links_port(self) -> int:
        """The port the links listener binds (``[links] port``, docs/links.md)."""
        if self.links.port is not None:
            return self.links.port
        return 0 if self.api_port == 0 else DEFAULT_LINKS_PORT

    @property
    def renew_min_interval_s(self) -> float:
        return min(self.agent_renew_min_interval_s, self.agent_cert_s / 10)

    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.state_path / 'master.db').resolve()}"


def load_master_config(
    path: Path | None = None, *, env: Mapping[str, str] | None = None, overrides: TomlTable | None = None
) -> MasterConfig:
    return load_config(MasterConfig, path=path, env_prefix="IDLEGRID_MASTER_", env=env, overrides=overrides)
