"""What the scheduler core reads (a ``Snapshot``) and what it answers (a ``Plan``): plain, frozen values.

The core is sans-I/O: the loop gathers a snapshot (the grid, the queue, usage, the policy, and ``now``),
calls ``schedule``, and carries out the decisions. Nothing here reads a clock or draws randomness.
Explanations use only plain types so the API can render them as JSON as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from common.inventory import ImageSource

Placement = Literal["binpack", "spread"]
Runtime = Literal["docker", "process", "simulated"]
Isolation = Literal["container", "sandbox", "none"]
Assignment = tuple[tuple[str, ...], ...]  # per replica, the unit ids it holds
Rental = Literal["on_demand", "interruptible", "reserved"]

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0
ON_DEMAND_RANK = 2**62  # an on-demand or reserved job's market rank: above every bid
K = TypeVar("K")  # an account, or an (account, project) pair


@dataclass(frozen=True, slots=True)
class Unit:
    """The thing placed: a whole GPU (``mig_profile`` None) or one MIG instance on ``parent``."""

    id: str
    host: str
    index: int
    model: str
    tier: str | None
    vram_mib: int
    compute_capability: tuple[int, int]
    nvlink_peers: frozenset[str] = frozenset()
    mig_profile: str | None = None
    parent: str | None = None
    healthy: bool = True
    vendor: str = "nvidia"  # who made the card (common.inventory.GPU_VENDORS)


@dataclass(frozen=True, slots=True)
class Host:
    id: str
    provider: str = ""
    region: str = ""
    reputation: float = 1.0
    bandwidth_mbps: float | None = None
    disk_free_gib: float | None = None  # as the host last reported it; None: not reported
    cpu_cores: float = 64.0
    ram_mib: int = 512 * 1024
    takes_work: bool = True  # False: drained, quarantined or offline
    online: bool = True  # False: its workloads are requeued
    runtime: Runtime = "docker"
    isolation: Isolation = "container"
    # Where its engine gets images, and the images it has (common/inventory.py ``image_refusal``); None: anything.
    image_source: ImageSource | None = None
    images: tuple[str, ...] = ()
    # Prices, in micro-units per GPU-hour (management/market/prices.py); the defaults are a free grid.
    price: int = 0  # on demand
    min_bid: int | None = 0  # the lowest bid an interruptible rental may make here; None: not rented interruptible
    reserved_price: int = 0  # per GPU-hour of a prepaid reserved period
    max_duration_s: float | None = None  # the longest rental it takes; None: no limit


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    """What one replica needs; a job has ``Job.replicas`` of them, each on one host."""

    gpus: int = 1
    min_vram_mib: int = 0
    models: frozenset[str] = frozenset()  # empty: any model
    vendors: frozenset[str] = frozenset()  # empty: any vendor
    tiers: frozenset[str] = frozenset()  # empty: any tier
    min_compute_capability: tuple[int, int] | None = None
    cpu_cores: float = 0.0
    ram_mib: int = 0
    mig_profile: str | None = None  # MIG instances of this profile instead of whole GPUs


@dataclass(frozen=True, slots=True)
class Constraints:
    regions: frozenset[str] = frozenset()  # empty: any region
    min_reputation: float = 0.0
    min_bandwidth_mbps: float | None = None
    min_disk_gib: float | None = None  # free disk the host must report
    nvlink: bool = False  # the GPUs of one replica must be pairwise NVLink-connected
    allow_process_runtime: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    """A workload as the scheduler sees it: queued, or running (``started_at`` and ``assignment`` set)."""

    id: str
    account: str
    project: str = ""
    priority: str = "normal"  # the name of a class in the policy
    submitted_at: float = 0.0
    replicas: int = 1
    request: ReplicaRequest = ReplicaRequest()
    constraints: Constraints = Constraints()
    max_duration_s: float | None = None
    placement: Placement | None = None  # None: the policy's default
    preemptible: bool = True
    started_at: float | None = None
    assignment: Assignment | None = None
    preempted_for: str | None = None  # running job already told to stop for this queued job
    # False: its image is "none", a command run on the host itself, which only hosts of the process runtime do; an image
    # runs only where a container engine is (the docker runtime). The simulated runtime takes both.
    runs_image: bool = True
    image: str = ""  # the image it runs (when ``runs_image``): a host must have it or be able to pull it
    avoid: frozenset[str] = frozenset()  # hosts where its container did not start through the host's fault
    # An endpoint's worker: among hosts of one price, those that already hold its image go first (a warm start).
    prefer_warm: bool = False
    # How it is rented (docs/scheduler.md, "Prices and bids"); the defaults are a free grid's job.
    rental: Rental = "on_demand"
    bid: int = 0  # interruptible: micro-units per GPU-hour offered
    max_price: int | None = None  # on_demand/reserved: the most it takes per GPU-hour (None: no cap)
    pin: str | None = None  # a host id: it rents that offer, and runs there or waits
    funded: bool = True  # False: the renter has no available money, so only hosts that charge it 0
    # A hard spend cap of its renter's reached (docs/payments.md, "Spend caps"): only hosts that charge it 0, and this
    # says which cap ("" for none).
    capped: str = ""
    # The most per GPU-hour the renter's available balance pays for one metering period of this job's GPUs (None: no
    # limit): work starts only where the balance covers its first period (management/market/money.affordable_price).
    affordable: int | None = None
    # The renter's available balance less the first period of its work placed but not running yet (None: no limit):
    # a cycle takes off what it places for the account, so the jobs after it see what is left.
    balance: int | None = None
    reserved_s: float | None = None  # reserved: the prepaid period (it counts as its max duration for hosts)

    @property
    def units_asked(self) -> int:
        return self.replicas * self.request.gpus

    @property
    def market_rank(self) -> int:
        """Higher goes first and is preempted last: on demand and reserved above any bid; interruptibles by bid."""
        return self.bid if self.rental == "interruptible" else ON_DEMAND_RANK

    @property
    def ends_at(self) -> float | None:
        if self.started_at is None or self.max_duration_s is None:
            return None
        return self.started_at + self.max_duration_s


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    rank: int  # higher goes first
    may_preempt: bool = False
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Quota:
    gpus: int | None = None  # units held at once, overall
    per_tier: Mapping[str, int] = field(default_factory=dict)


DEFAULT_CLASSES = (
    PriorityClass("critical", 300, may_preempt=True, preemptible=False),
    PriorityClass("high", 200, may_preempt=True),
    PriorityClass("normal", 100),
    PriorityClass("low", 0),
)


@dataclass(frozen=True, slots=True)
class Policy:
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    aging_step_s: float = 600.0  # one step of boost per this much waiting
    aging_max_boost: int = 6  # boost steps are capped; a boost never lifts a job into the next class
    half_life_s: float = DEFAULT_HALF_LIFE_S
    shares: Mapping[str, float] = field(default_factory=dict)  # account -> share (absent: 1.0)
    project_shares: Mapping[tuple[str, str], float] = field(default_factory=dict)
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    placement_default: Placement = "binpack"
    backfill: bool = True
    allow_process_runtime: bool = False  # operator-wide
    grace_s: float = 30.0  # preemption grace, carried out by the loop
    max_places_per_cycle: int = 128  # a cycle places a bounded batch; the loop runs again
    max_considered_per_cycle: int = 1024  # and looks at a bounded part of the queue
    max_preemption_attempts_per_cycle: int = 2  # what-ifs for preemptors are bounded too
    metering_period_s: float = 60.0  # the market's: work starts only where the balance pays one such period

    def priority_class(self, name: str) -> PriorityClass | None:
        for c in self.classes:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    hosts: Mapping[str, Host]
    units: Mapping[str, Unit]
    holders: Mapping[str, str]  # unit id -> job id, every hold (also ones that are not scheduler jobs)
    running: Mapping[str, Job]  # jobs holding units
    queue: Sequence[Job]
    usage: Mapping[str, float] = field(default_factory=dict)  # account -> decayed GPU-seconds as of now
    project_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    policy: Policy = Policy()


# --- decisions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Place:
    job_id: str
    assignment: Assignment


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str  # the victim
    for_job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Requeue:
    job_id: str
    reason: str
    host: str = ""  # the host through which the run ended, where the snapshot knows it


@dataclass(frozen=True, slots=True)
class Reject:
    job_id: str
    reason: str


Decision = Place | Preempt | Requeue | Reject


@dataclass(slots=True)
class FilterCount:
    name: str
    removed: int
    remaining: int
    detail: str = ""  # what removed them, where one filter has several reasons (price: max_price, bid, pin, ...)


@dataclass(slots=True)
class QuotaCheck:
    quota: str  # "gpus" or "tier:<name>"
    limit: int
    in_use: int
    asked: int


@dataclass(slots=True)
class Explanation:
    job_id: str
    position: int  # 1-based, in the order the core considers jobs
    queue_length: int
    ahead: list[str] = field(default_factory=list)
    filters: list[FilterCount] = field(default_factory=list)
    quota: QuotaCheck | None = None
    blocked_by: str | None = None
    reserved_start: float | None = None
    estimated_start: float | None = None
    fits_now: bool = False
    cannot_fit: str | None = None  # why it cannot be placed on the grid as it is now, even empty (it waits for hosts)
    summary: str = ""


@dataclass(slots=True)
class Plan:
    decisions: list[Decision] = field(default_factory=list)
    explanations: dict[str, Explanation] = field(default_factory=dict)

    def places(self) -> list[Place]:
        return [d for d in self.decisions if isinstance(d, Place)]

    def preempts(self) -> list[Preempt]:
        return [d for d in self.decisions if isinstance(d, Preempt)]


# --- usage, for fair share -------------------------------------------------------------------------


def decay(usage: Mapping[K, float], elapsed_s: float, half_life_s: float) -> dict[K, float]:
    """Usage ``elapsed_s`` later: every figure halves each ``half_life_s``."""
    if elapsed_s <= 0 or half_life_s <= 0 or math.isinf(half_life_s):
        return dict(usage)
    factor = 0.5 ** (elapsed_s / half_life_s)
    return {k: v * factor for k, v in usage.items()}


def add_usage(usage: Mapping[K, float], account: K, gpu_seconds: float) -> dict[K, float]:
    """Usage with ``gpu_seconds`` more charged to ``account``."""
    out = dict(usage)
    out[account] = out.get(account, 0.0) + gpu_seconds
    return out
