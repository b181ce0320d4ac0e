"""An endpoint's records (docs/endpoints.md, "The endpoint resource"): what its workers run, how they scale, the bounds
of its requests, and its invocation keys.

``EndpointSpec`` is what a renter writes. Its worker part has the fields of a workload's spec that a worker needs
(image, or ``none`` with ``constraints.allow_process_runtime``; command, GPU needs, env with ``${secret:NAME}`` values,
registry credentials), and ``worker_spec`` turns it into the ``WorkloadSpec`` each worker is submitted as, so an
endpoint is refused at create for the same reasons a workload is at submit (management/services/endpoints.py).
``EndpointScaling`` carries the autoscaler's ``ScalingPolicy`` fields with bounds, and makes the policy itself, so
the policy's own checks refuse a bad one. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Annotated, Any, Literal

import msgspec

from common.containers import RegistryAuth
from management.endpoints.autoscaler import ScalingPolicy
from management.endpoints.balancer import HoldLimits
from management.endpoints.queue import QueueLimits
from master.port import (
    Amount,
    CommandArg,
    EnvName,
    EnvValue,
    ImageRef,
    LabelKey,
    LabelValue,
    PlacementConstraints,
    ReplicaSpec,
    ShortText,
    WorkloadName,
    WorkloadSpec,
)

__all__ = [
    "ENDPOINT_ID_PREFIX",
    "INVOCATION_KEY_PREFIX",
    "KEY_ID_PREFIX",
    "MAX_WORKERS",
    "MODES",
    "EndpointKeyRecord",
    "EndpointRecord",
    "EndpointScaling",
    "EndpointSpec",
    "hash_key",
    "new_endpoint_id",
    "new_invocation_key",
]

ENDPOINT_ID_PREFIX = "ep-"
INVOCATION_KEY_PREFIX = "igek_"  # an invocation key's secret; an API key's is "igak_" (master/accounts.py)
KEY_ID_PREFIX = "epk-"  # an invocation key's public id
MAX_WORKERS = 100  # one endpoint's workers at most
MAX_CONCURRENCY = 1000  # requests one worker holds at once, at most
# An endpoint's spec, or the fields a change gives, as JSON before EndpointSpec checks them (an update merges them
# into the stored spec's JSON, field by field for its tables, and the result is decoded and checked as at create).
EndpointSpecJson = dict[str, Any]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=7 * 86400.0)]
# How an endpoint takes requests (docs/endpoints.md): "queue", through the request routes and the worker API (workers
# pull); "load_balanced", as HTTP to the workers' own server on ``http_port``, through the links listener.
EndpointMode = Literal["queue", "load_balanced"]
MODES: tuple[str, ...] = ("queue", "load_balanced")
MAX_HELD = 10_000  # requests held for a ready worker at once, per endpoint, at most
MAX_HOLD_S = 3600.0  # the longest a held request may wait
# A readiness path: absolute, printable, no space, no fragment; a query is allowed ("/health?full=1").
_READINESS_PATH = re.compile(r"^/[!-~]*\Z")


class EndpointScaling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The scaling policy's fields (management/endpoints/autoscaler.py's ``ScalingPolicy``), bounded; ``policy()`` is
    the policy itself, and a spec whose policy the autoscaler would refuse does not decode."""

    min_workers: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKERS)] = 0  # 0: scale to zero
    max_workers: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKERS)] = 1
    idle_timeout_s: Seconds = 60.0
    target_queue_delay_s: Seconds = 4.0
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONCURRENCY)] = 1

    def __post_init__(self) -> None:
        self.policy()  # its ValueError names the rule broken

    def policy(self) -> ScalingPolicy:
        return ScalingPolicy(
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            idle_timeout_s=self.idle_timeout_s,
            target_queue_delay_s=self.target_queue_delay_s,
            concurrency=self.concurrency,
        )


class EndpointSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A renter's endpoint: what each worker runs, how the workers scale, and its requests' bounds."""

    name: WorkloadName
    image: ImageRef  # or "none": the command runs on a process-runtime host (constraints.allow_process_runtime)
    command: Annotated[list[CommandArg], msgspec.Meta(max_length=256)] = []
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=256)] = {}  # values may name secrets
    replica: ReplicaSpec = msgspec.field(default_factory=ReplicaSpec)  # one worker's GPU, CPU and RAM needs
    constraints: PlacementConstraints = msgspec.field(default_factory=PlacementConstraints)
    priority: ShortText = "normal"
    project: ShortText = "default"
    labels: Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=64)] = {}
    # A private image's registry: the password is sent to the hosts only and never shown again (answers give the
    # username alone); the stored record keeps it sealed, as a workload's does.
    registry_auth: RegistryAuth | None = None
    scaling: EndpointScaling = msgspec.field(default_factory=EndpointScaling)
    execution_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86400.0)] = 600.0  # one attempt at most
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400.0)] = 86400.0  # a request's life, queued or running
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3  # requeues after a lost worker
    # The most its workers may cost in any 24 hours, in the grid's currency ("25.00"); at the cap the autoscaler starts
    # no worker (the running ones finish their work and scale down as usual). None: no cap (docs/endpoints.md).
    daily_spend_cap: Amount | None = None
    # Load-balanced mode (docs/endpoints.md, "Load-balanced mode"). A stored endpoint made before these fields reads
    # as queue mode, and the other fields are not read by a queue-mode endpoint.
    mode: EndpointMode = "queue"
    http_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8000  # where each worker's HTTP server listens
    readiness_path: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] = "/health"  # 200 when ready
    max_held: Annotated[int, msgspec.Meta(ge=0, le=MAX_HELD)] = 256  # requests held at once while none is ready
    max_hold_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_HOLD_S)] = 120.0  # one held request's longest wait

    def __post_init__(self) -> None:
        for field in ("execution_timeout_s", "ttl_s", "max_hold_s"):
            value = getattr(self, field)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"{field} must be a finite number, not {value!r}")
        if self.execution_timeout_s > self.ttl_s:
            raise ValueError(f"execution_timeout_s ({self.execution_timeout_s:g}) must not exceed ttl_s ({self.ttl_s:g})")
        if not _READINESS_PATH.match(self.readiness_path) or "#" in self.readiness_path:
            raise ValueError(
                f"readiness_path must be an absolute path such as /health (printable, no space, no '#'), "
                f"not {self.readiness_path!r}"
            )

    @property
    def load_balanced(self) -> bool:
        return self.mode == "load_balanced"

    def hold_limits(self) -> HoldLimits:
        """How many requests a load-balanced endpoint holds while no worker is ready, and for how long."""
        return HoldLimits(max_held=self.max_held, max_hold_s=self.max_hold_s)

    def limits(self) -> QueueLimits:
        """Its requests' bounds, as the request queue applies them."""
        return QueueLimits(
            concurrency=self.scaling.concurrency,
            max_retries=self.max_retries,
            ttl_s=self.ttl_s,
            execution_timeout_s=self.execution_timeout_s,
        )

    def worker_spec(self) -> WorkloadSpec:
        """The workload each worker is: one replica, no network, not restarted in place (the autoscaler replaces it). A
        load-balanced endpoint's worker declares its ``http_port``, the only port the Master's tunnels may reach."""
        return WorkloadSpec(
            name=self.name,
            image=self.image,
            command=list(self.command),
            env=dict(self.env),
            replica=self.replica,
            constraints=self.constraints,
            priority=self.priority,
            project=self.project,
            labels=dict(self.labels),
            registry_auth=self.registry_auth,
            restart_policy="never",
            network="none",
            ports=[self.http_port] if self.load_balanced else [],
        )


class EndpointRecord(msgspec.Struct, kw_only=True):
    """An endpoint as stored: its spec (the registry password replaced by ``SEALED``, the sealed one beside it)."""

    id: str  # "ep-" + random hex
    account: str  # the renter account that owns it
    spec: EndpointSpec
    created_at: float
    updated_at: float
    sealed_registry_password: str = ""


class EndpointKeyRecord(msgspec.Struct, kw_only=True):
    """An invocation key of one endpoint: only its hash is stored; the key itself is shown once, at create."""

    id: str  # "epk-" + random hex: what lists show and revoke names
    endpoint: str
    account: str  # the endpoint's owner, who made it
    name: str
    key_hash: str  # hash_key of the key
    created_at: float
    revoked_at: float | None = None


def new_endpoint_id() -> str:
    return ENDPOINT_ID_PREFIX + secrets.token_hex(8)


def new_invocation_key() -> tuple[str, str]:
    """A new key's public id and its secret."""
    return KEY_ID_PREFIX + secrets.token_hex(8), INVOCATION_KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """A key's stored form: keys are long random strings, so a plain SHA-256 is sound (as for API keys)."""
    return hashlib.sha256(key.encode()).hexdigest()
