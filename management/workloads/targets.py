"""What a workload spec makes the grid connect to on the renter's behalf, judged at submit by the egress rule
(common/egress.py): its storage endpoint and its image's registry must be public, or allowed by the operator by name
(the Master's ``egress_allow``). Names are resolved here and every address judged; each host judges them again, with
its own provider's list, at every connection it makes (agent/storage/connections.py, the pull path in
agent/runtime/docker.py). A name that does not resolve here is let through: the host's connection then fails, saying
so, and a name that resolves differently later is judged again there.
"""

from __future__ import annotations

from common.egress import EgressRule, registry_refusal_before_dns, registry_target, url_target
from common.errors import EgressRefused
from management.workloads.spec import InvalidWorkloadSpec
from master.port import WorkloadSpec

__all__ = ["check_targets"]


async def check_targets(spec: WorkloadSpec, rule: EgressRule) -> None:
    """InvalidWorkloadSpec, naming the field and what to change, for a target ``rule`` refuses."""
    endpoint = spec.storage.endpoint if spec.storage is not None else None
    if endpoint is not None:
        host, port = url_target(endpoint)  # the struct's pattern already made it an http(s) URL with a host
        await _judge("storage.endpoint", rule, f"storage endpoint {endpoint}", host, port)
    refusal = registry_refusal_before_dns(rule, spec.image)
    if refusal is not None:
        raise InvalidWorkloadSpec(f"image: {refusal}") from None
    target = registry_target(spec.image)
    if target is not None:
        await _judge("image", rule, f"image {spec.image!r}: registry {target[0]}", *target)


async def _judge(field: str, rule: EgressRule, what: str, host: str, port: int) -> None:
    try:
        await rule.addresses_async(what, host, port)
    except EgressRefused as exc:
        raise InvalidWorkloadSpec(f"{field}: {exc}") from None
    except (OSError, UnicodeError):
        return  # does not resolve here; the host's own check and connection judge it
