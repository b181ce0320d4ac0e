"""MIG (Multi-Instance GPU) profiles: which instances a GPU model can be split into, and whether a layout fits.

Figures follow NVIDIA's MIG User Guide ("Supported MIG Profiles"), written down by hand. A GPU has 7 compute
slices and 8 memory slices; a profile ``<c>g.<m>gb`` takes ``c`` compute slices and a fixed run of memory
slices starting at one of a few allowed places. The A100-40GB's names are 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb,
3g.20gb, 4g.20gb, 7g.40gb; the 80 GB cards (A100-80GB, H100-80GB) carry the same geometry under the names
1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb. "+me" (media extensions) may be taken once.

``memory_mib`` of an instance is the memory slices' share of the card's catalog memory: what NVML reports on a
real card is a little less (an H100's 1g.10gb reads 9.75 GiB). The simulator reports this figure; on hardware
the agent reports what NVML says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    name: str  # "1g.10gb", without NVIDIA's "MIG " prefix
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]  # memory slices an instance of it may start at


class MigLayoutError(ValueError):
    """A list of MIG profiles that the model does not offer, or that does not fit on one GPU."""


def _geometry(one: str, one_me: str, one_double: str, two: str, three: str, four: str, seven: str) -> tuple[MigProfile, ...]:
    return (
        MigProfile(one, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(one_me, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(one_double, 1, 2, 4, (0, 2, 4, 6)),
        MigProfile(two, 2, 2, 3, (0, 2, 4)),
        MigProfile(three, 3, 4, 2, (0, 4)),
        MigProfile(four, 4, 4, 1, (0,)),
        MigProfile(seven, 7, 8, 1, (0,)),
    )


_40GB = _geometry("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_80GB = _geometry("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")

# catalog model key -> its profiles by name. Models not listed here have no MIG.
MIG_PROFILES: Mapping[str, Mapping[str, MigProfile]] = MappingProxyType(
    {
        "a100-40gb": MappingProxyType({p.name: p for p in _40GB}),
        "a100-40gb-pcie": MappingProxyType({p.name: p for p in _40GB}),
        "a100-80gb": MappingProxyType({p.name: p for p in _80GB}),
        "a100-80gb-pcie": MappingProxyType({p.name: p for p in _80GB}),
        "h100-sxm": MappingProxyType({p.name: p for p in _80GB}),
        "h100-pcie": MappingProxyType({p.name: p for p in _80GB}),
    }
)


def profiles_of(model_key: str) -> Mapping[str, MigProfile]:
    """The MIG profiles a catalog model offers; empty for a model without MIG."""
    return MIG_PROFILES.get(model_key, MappingProxyType({}))


def instance_memory_mib(card_memory_mib: int, profile: MigProfile) -> int:
    return card_memory_mib * profile.memory_slices // MEMORY_SLICES


def lay_out(model_key: str, names: Sequence[str]) -> list[tuple[MigProfile, int]]:
    """Each profile named with the memory slice it starts at, in the order named; MigLayoutError when the model
    has no such profile, a profile is taken more often than allowed, or the instances do not fit on one GPU."""
    offered = profiles_of(model_key)
    if not offered:
        raise MigLayoutError(f"GPU model {model_key!r} has no MIG; MIG models: {', '.join(sorted(MIG_PROFILES))}")
    profiles = []
    for name in names:
        profile = offered.get(name)
        if profile is None:
            raise MigLayoutError(f"{model_key} has no MIG profile {name!r}; it offers {', '.join(offered)}")
        profiles.append(profile)
    for profile in set(profiles):
        taken = profiles.count(profile)
        if taken > profile.max_instances:
            raise MigLayoutError(f"{model_key} takes at most {profile.max_instances} × {profile.name}, not {taken}")
    compute = sum(p.compute_slices for p in profiles)
    if compute > COMPUTE_SLICES:
        raise MigLayoutError(f"{' + '.join(names)} needs {compute} compute slices; a GPU has {COMPUTE_SLICES}")
    starts = _place(sorted(range(len(profiles)), key=lambda i: -profiles[i].memory_slices), profiles, {}, frozenset())
    if starts is None:
        raise MigLayoutError(f"{' + '.join(names)} does not fit on one {model_key}: no placement of its memory slices")
    return [(profiles[i], starts[i]) for i in range(len(profiles))]


def _place(order: list[int], profiles: list[MigProfile], starts: dict[int, int], used: frozenset[int]) -> dict[int, int] | None:
    """A start for every instance in ``order`` (largest first), by trying each allowed start: at most 7 instances."""
    if not order:
        return starts
    first, rest = order[0], order[1:]
    profile = profiles[first]
    for start in profile.placements:
        span = frozenset(range(start, start + profile.memory_slices))
        if span & used:
            continue
        found = _place(rest, profiles, {**starts, first: start}, used | span)
        if found is not None:
            return found
    return None
