"""The workload spec: the checks it must pass against this Master's configuration, and what it becomes on a host.

``WorkloadSpec`` (and ``ReplicaSpec``, ``PlacementConstraints``) are records of the store and live in master/records.py;
the struct checks their shape and bounds. What depends on this Master's configuration (catalog models, tiers,
priority classes) is checked here, at submit only, so a stored record never stops decoding when the catalog changes.
A replica's container crosses to its agent as the typed ``common.containers.ContainerSpec`` (``container_spec``).
Pure: no I/O.
"""

from __future__ import annotations

import re
import secrets as random_secrets
from collections.abc import Collection, Mapping

from common.catalog import CATALOG
from common.containers import ContainerSpec, EndpointWorkerSpec, RegistryAuth
from common.errors import IdlegridError
from common.overlay import OverlaySpec
from common.storage import ContainerStorage, secret_ref
from master.port import Assignment, TierPolicy, WorkloadRecord, WorkloadSpec

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "NO_GANG_OVERLAY",
    "InvalidWorkloadSpec",
    "WorkloadSpec",
    "check_spec",
    "container_name",
    "container_spec",
    "new_worker_token",
    "workload_of",
]

_CONTAINER = re.compile(r"^(wl-[0-9a-f]+)-r(\d+)-a(\d+)\Z")  # container_name's pattern

# The priority classes every Master knows, lowest first; the scheduler's policy may define its own.
DEFAULT_PRIORITY_CLASSES: tuple[str, ...] = ("low", "normal", "high", "critical")


class InvalidWorkloadSpec(IdlegridError):
    """A workload spec that names something this Master does not have (a GPU model, a tier, a priority class)."""

    code = "invalid_workload_spec"


def check_spec(spec: WorkloadSpec, *, policy: TierPolicy, priority_classes: Collection[str], gang_overlay: bool = False) -> None:
    """Refuse what a spec names that is not configured here, naming the field; InvalidWorkloadSpec. ``gang_overlay``:
    whether this Master runs the gangs' overlay (lighthouses listed in its ``[overlay]``)."""
    unknown_models = [m for m in spec.replica.models if m not in CATALOG]
    if unknown_models:
        raise InvalidWorkloadSpec(
            f"replica.models: unknown GPU model {', '.join(map(repr, unknown_models))}; "
            "use catalog keys such as 'h100-sxm' (GET /api/v1/tiers lists what is sold)"
        )
    tiers = [t.name for t in policy.tiers]
    unknown_tiers = [t for t in spec.replica.tiers if t not in tiers]
    if unknown_tiers:
        raise InvalidWorkloadSpec(
            f"replica.tiers: unknown tier {', '.join(map(repr, unknown_tiers))}; the tiers are: {', '.join(tiers)}"
        )
    if spec.priority not in priority_classes:
        raise InvalidWorkloadSpec(
            f"priority: unknown priority class {spec.priority!r}; the classes are: {', '.join(priority_classes)}"
        )
    if spec.replica.mig_profile is not None and spec.replica.gpus != 1:
        raise InvalidWorkloadSpec("replica.gpus: a replica with a mig_profile takes exactly one MIG instance (gpus = 1)")
    if spec.replicas > 1 and spec.network == "overlay" and not gang_overlay:
        raise InvalidWorkloadSpec(NO_GANG_OVERLAY)


# Said to whoever submits a gang to a Master without lighthouses: the renter's way round it and the operator's fix.
NO_GANG_OVERLAY = (
    "replicas: this grid runs no gang overlay, so the replicas of one workload cannot reach each other (no MASTER_ADDR, "
    "RANK or WORLD_SIZE). Its operator runs one with 'idlegrid ca issue-lighthouse' and lists it in the Master's config "
    "as [[overlay.lighthouses]] (docs/overlay.md); replicas that need not reach each other can be submitted with "
    'network = "none" (--network none)'
)


def container_name(workload_id: str, replica: int, attempt: int) -> str:
    """The name of a replica's container on its host, the same every time it is asked: ``wl-<hex>-r<n>-a<n>``.

    Valid per common/containers.py's pattern (letters, digits, ``_.-``; 63 characters at most).
    """
    return f"{workload_id}-r{replica}-a{attempt}"


def workload_of(container: str) -> str | None:
    """The workload id a container name belongs to (``wl-<hex>-r<replica>-a<attempt>``), None for other names."""
    match = _CONTAINER.match(container)
    return match.group(1) if match else None


def new_worker_token() -> str:
    """A new endpoint worker's bearer token (common/containers.py ``EndpointWorkerSpec.token``): one per create."""
    return random_secrets.token_urlsafe(32)


def container_spec(
    rec: WorkloadRecord,
    a: Assignment,
    overlay: OverlaySpec | None = None,
    *,
    secrets: Mapping[str, str] | None = None,
    storage: ContainerStorage | None = None,
    registry_password: str | None = None,
    worker_token: str = "",
) -> ContainerSpec:
    """What replica ``a`` of ``rec`` runs on its host: the renter's image, command, env, labels and ports, the GPUs
    placed for it, its CPU and RAM shares, its registry credentials, the workload id and replica the agent turns
    into reserved labels, and a gang replica's place on its network (``overlay``, docs/overlay.md). The Master
    validates it again when the command is made (master/commands.py).

    ``secrets``: the values of the secrets the spec names (the runner resolves them; management/workloads/storage.py),
    put in place of the env's ``${secret:NAME}`` values; ``storage``: the replica's resolved object storage;
    ``registry_password``: the registry password opened from the record (``rec.sealed_registry_password``);
    ``worker_token``: an endpoint worker's bearer token, minted for this create (``rec.endpoint_worker`` set: the agent
    serves the container its worker API, docs/endpoints.md)."""
    spec = rec.spec
    auth = spec.registry_auth
    worker = rec.endpoint_worker
    return ContainerSpec(
        name=a.container,
        image=spec.image,
        command=list(spec.command),
        env={k: (secrets or {}).get(ref, v) if (ref := secret_ref(v)) else v for k, v in spec.env.items()},
        gpus=list(a.units),
        labels=dict(spec.labels),
        workload_id=rec.id,
        replica=a.replica,
        ports=list(spec.ports),
        cpus=spec.replica.cpu_cores,
        memory_mib=spec.replica.ram_mib,
        registry_auth=None
        if auth is None
        else RegistryAuth(username=auth.username, password=auth.password if registry_password is None else registry_password),
        overlay=overlay,
        storage=storage,
        endpoint_worker=None
        if worker is None
        else EndpointWorkerSpec(
            endpoint_id=worker.endpoint_id, worker_id=worker.worker_id, token=worker_token, concurrency=worker.concurrency
        ),
    )
