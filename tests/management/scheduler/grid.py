"""Builders for scheduler snapshots: small grids written the way the tests talk about them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from management.scheduler import Host, Job, Place, Plan, Policy, Snapshot, Unit

MODELS = {  # model -> (VRAM MiB, compute capability, tier, NVLink among the host's GPUs)
    "h100-sxm": (81559, (9, 0), "premium", True),
    "a100-80gb": (81920, (8, 0), "premium", True),
    "l40s": (46068, (8, 9), "standard", False),
    "rtx-4090": (24564, (8, 9), "consumer", False),
}


def gpus(host: str, n: int, model: str = "h100-sxm", *, healthy: bool = True) -> list[Unit]:
    vram, cc, tier, nvlink = MODELS[model]
    ids = [f"{host}-g{i}" for i in range(n)]
    return [
        Unit(
            uid,
            host,
            i,
            model,
            tier,
            vram,
            cc,
            nvlink_peers=frozenset(x for x in ids if x != uid) if nvlink else frozenset(),
            healthy=healthy,
        )
        for i, uid in enumerate(ids)
    ]


def mig(host: str, parent_index: int, profile: str, n: int) -> list[Unit]:
    parent = f"{host}-g{parent_index}"
    return [
        Unit(f"{parent}-mig{i}", host, parent_index, "a100-80gb", "premium", 10240, (8, 0), mig_profile=profile, parent=parent)
        for i in range(n)
    ]


def grid(
    hosts: Mapping[str, int] | Iterable[Host],
    model: str = "h100-sxm",
    *,
    units: Sequence[Unit] = (),
) -> tuple[dict[str, Host], dict[str, Unit]]:
    """Hosts (name -> GPU count, all of ``model``) or Host objects (then ``units`` are given)."""
    if isinstance(hosts, Mapping):
        hs = {h: Host(h) for h in hosts}
        us = {u.id: u for h, n in hosts.items() for u in gpus(h, n, model)}
    else:
        hs = {h.id: h for h in hosts}
        us = {}
    us.update({u.id: u for u in units})
    return hs, us


def running(job: Job, assignment: Sequence[Sequence[str]], started_at: float = 0.0) -> Job:
    return replace(job, started_at=started_at, assignment=tuple(tuple(r) for r in assignment))


def snapshot(
    hosts: dict[str, Host],
    units: dict[str, Unit],
    *,
    queue: Sequence[Job] = (),
    run: Sequence[Job] = (),
    extra_holders: Mapping[str, str] | None = None,
    now: float = 1000.0,
    policy: Policy | None = None,
    usage: Mapping[str, float] | None = None,
) -> Snapshot:
    holders = {u: j.id for j in run for r in (j.assignment or ()) for u in r}
    holders.update(extra_holders or {})
    return Snapshot(
        now=now,
        hosts=hosts,
        units=units,
        holders=holders,
        running={j.id: j for j in run},
        queue=list(queue),
        usage=dict(usage or {}),
        policy=policy or Policy(),
    )


def placed(plan: Plan) -> dict[str, tuple[tuple[str, ...], ...]]:
    return {d.job_id: d.assignment for d in plan.decisions if isinstance(d, Place)}


def host_of(units: Mapping[str, Unit], replica: Iterable[str]) -> set[str]:
    return {units[u].host for u in replica}
