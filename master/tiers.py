"""Tier classification: which tier a GPU is sold in, by a policy file (master/tiers.toml), not by code.

A GPU is first identified against the catalog and verified: reported facts (memory, compute
capability, NVLink) and measured figures must fit the claimed model, or the GPU is flagged and gets
no tier, so a host cannot talk itself up. A verified GPU gets the first tier, best first, whose
criteria it meets. An unknown model is flagged ``unknown_model`` and gets no tier either: nothing
vouches for its figures, and an operator adds it to the catalog to sell it.

Everything here is pure; only ``TierPolicy.load`` reads a file.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from common.catalog import CATALOG, GpuModel, match_model, reference_gpu_info
from common.config import TomlTable
from common.errors import ConfigError
from common.inventory import GPU_VENDORS, GpuInfo, HostInfo

# A tier's criteria by their policy-file names, and a tier as GET /api/v1/tiers shows it: what the criteria hold is the
# policy file's (numbers, a "major.minor" string, a flag), whatever it sets, so it is open.
TierJson = dict[str, Any]
# A card's figure for each ``min_*`` criterion (a number, (major, minor) for compute capability, None: unknown),
# compared with the rule's field of the same name: open, as the rule's fields are.
GpuFacts = dict[str, Any]

# Keys of ``classify(measured=...)``: figures a benchmark measured, compared with the catalog's.
MEASURED_FIGURES = {"fp16_tflops": "throughput", "bf16_tflops": "throughput", "memory_bandwidth_gbs": "bandwidth"}

# Criterion -> (label, unit) for explanations a person reads.
_LABELS = {
    "min_vram_gib": ("VRAM", "GiB"),
    "min_fp16_tflops": ("FP16", "TFLOPS"),
    "min_bf16_tflops": ("BF16", "TFLOPS"),
    "min_memory_bandwidth_gbs": ("memory bandwidth", "GB/s"),
    "min_compute_capability": ("compute capability", ""),
    "min_pcie_gen": ("PCIe generation", ""),
    "min_pcie_width": ("PCIe width", "lanes"),
    "min_network_mbps": ("network", "Mbit/s"),
}
_FLOAT_CRITERIA = ("min_vram_gib", "min_fp16_tflops", "min_bf16_tflops", "min_memory_bandwidth_gbs", "min_network_mbps")
_INT_CRITERIA = ("min_pcie_gen", "min_pcie_width")


@dataclass(frozen=True)
class TierRule:
    name: str
    description: str = ""
    min_vram_gib: float | None = None
    min_fp16_tflops: float | None = None
    min_bf16_tflops: float | None = None
    min_memory_bandwidth_gbs: float | None = None
    min_compute_capability: str | None = None
    min_pcie_gen: int | None = None
    min_pcie_width: int | None = None
    require_nvlink: bool = False
    min_network_mbps: float | None = None
    # The GPU's vendor (common.inventory.GPU_VENDORS): a tier sells one vendor's cards, so a renter asking for it gets
    # the software stack (CUDA, ROCm) its image was built for. None: any vendor.
    vendor: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"tier name must be a non-empty string, got {self.name!r}")
        _check(isinstance(self.description, str), "description", self.description, "a string")
        for key in _FLOAT_CRITERIA:
            value = getattr(self, key)
            _check(value is None or (_is_number(value) and value >= 0), key, value, "a number >= 0")
        for key in _INT_CRITERIA:
            value = getattr(self, key)
            _check(value is None or (_is_int(value) and value >= 1), key, value, "an integer >= 1")
        cc = self.min_compute_capability
        _check(
            cc is None or (isinstance(cc, str) and _parse_cc(cc) is not None),
            "min_compute_capability",
            cc,
            'a string "major.minor" such as "8.0"',
        )
        _check(isinstance(self.require_nvlink, bool), "require_nvlink", self.require_nvlink, "true or false")
        _check(self.vendor is None or self.vendor in GPU_VENDORS, "vendor", self.vendor, f"one of {', '.join(GPU_VENDORS)}")

    def criteria(self) -> TierJson:
        """The criteria this rule sets, by their policy-file names."""
        skip = {"name", "description"}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) not in (None, False)
        }


@dataclass(frozen=True)
class TierPolicy:
    tiers: tuple[TierRule, ...]  # best first
    vram_tolerance: float = 0.07  # reported memory vs catalog, as a fraction
    min_throughput_fraction: float = 0.6  # measured TFLOPS below this fraction of the catalog's: flagged
    min_bandwidth_fraction: float = 0.7  # measured bandwidth below this fraction of the catalog's: flagged

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("a tier policy needs at least one [[tier]]")
        names = [t.name for t in self.tiers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"tier names must be unique; repeated: {', '.join(duplicates)}")
        _check(
            _is_number(self.vram_tolerance) and 0 <= self.vram_tolerance < 1,
            "vram_tolerance",
            self.vram_tolerance,
            "a number in [0, 1)",
        )
        for key in ("min_throughput_fraction", "min_bandwidth_fraction"):
            value = getattr(self, key)
            _check(_is_number(value) and 0 <= value <= 1, key, value, "a number in [0, 1]")

    @classmethod
    def load(cls, path: Path | None = None) -> TierPolicy:
        """The policy in ``path``, or the built-in master/tiers.toml when None."""
        if path is None:
            source = "built-in tier policy master/tiers.toml"
            text = resources.files("master").joinpath("tiers.toml").read_text(encoding="utf-8")
        else:
            source = f"tier policy {path}"
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
        try:
            return cls.from_mapping(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source} is not valid TOML: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_mapping(cls, data: TomlTable) -> TierPolicy:
        """A policy from parsed TOML; ConfigError names the offending key or value."""
        _reject_unknown(data, {"tier", "verification"}, "top level")
        tables = data.get("tier")
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise ConfigError("expected one or more [[tier]] tables")
        verification = data.get("verification", {})
        if not isinstance(verification, dict):
            raise ConfigError("[verification] must be a table")
        _reject_unknown(verification, {"vram_tolerance", "min_throughput_fraction", "min_bandwidth_fraction"}, "[verification]")
        return cls(tiers=tuple(_rule(i, t) for i, t in enumerate(tables)), **verification)


@dataclass(frozen=True)
class Classification:
    model: str  # catalog key, or "" when unknown
    tier: str | None  # None when flagged or when no tier matches
    flags: tuple[str, ...]  # why the GPU is not trusted: "unknown_model", "vram_mismatch", ...
    reasons: tuple[str, ...]  # explanations a person reads, one per flag or decision


# classify's answers by what it reads (``_classify_key``): a fleet holds few kinds of card, and each hello classifies
# every GPU of its host (8 per host, about 55 us each uncached: 45 s of the Master's CPU for a 100,000-host ramp).
# Bounded: emptied when full. Each entry keeps its policy, so an answer is only reused for the very same policy object.
CLASSIFY_CACHE_SIZE = 4096
_classified: dict[tuple[object, ...], tuple[TierPolicy, Classification]] = {}


def classify(
    info: GpuInfo,
    policy: TierPolicy,
    *,
    host: HostInfo | None = None,
    measured: Mapping[str, float] | None = None,
) -> Classification:
    """Identify, verify and tier one GPU. Never raises on odd reported values: they are flagged instead.

    Pure: the same facts under the same policy give the same answer, so answers are kept (``_classified``)."""
    key = _classify_key(info, policy, host, measured)
    if key is None:
        return _classify(info, policy, host, measured)
    kept = _classified.get(key)
    if kept is not None and kept[0] is policy:
        return kept[1]
    answer = _classify(info, policy, host, measured)
    if len(_classified) >= CLASSIFY_CACHE_SIZE:
        _classified.clear()
    _classified[key] = (policy, answer)
    return answer


def _classify_key(
    info: GpuInfo, policy: TierPolicy, host: HostInfo | None, measured: Mapping[str, float] | None
) -> tuple[object, ...] | None:
    """Everything of the inputs ``_classify`` reads (not the GPU's uuid, index or bus id); None when unhashable."""
    try:
        key = (
            id(policy),
            info.name,
            info.memory_total_mib,
            info.compute_capability,
            info.vendor,
            info.pcie_gen,
            info.pcie_width,
            _active_nvlinks(info),
            _network_mbps(host),
            tuple(sorted(measured.items())) if measured else (),
        )
        hash(key)
    except TypeError:  # a measured figure of an odd type: classified afresh (and flagged there)
        return None
    return key


def _classify(info: GpuInfo, policy: TierPolicy, host: HostInfo | None, measured: Mapping[str, float] | None) -> Classification:
    model = match_model(info)
    if model is None:
        reason = f"{info.name!r} is not a known GPU model; it is not tiered until the catalog lists it"
        return Classification("", None, ("unknown_model",), (reason,))
    problems = _verify(info, model, policy, measured or {})
    if problems:
        flags = tuple(dict.fromkeys(flag for flag, _ in problems))
        return Classification(model.key, None, flags, tuple(reason for _, reason in problems))
    return _assign_tier(info, model, policy, host)


def network_floor_mbps(info: GpuInfo, policy: TierPolicy) -> float | None:
    """The network floor (``min_network_mbps``) of the tier this GPU's hardware earns, whatever the host's measured
    bandwidth: a host under it is kept from that tier. None: the hardware earns no tier, or its tier sets no floor."""
    tier = classify(info, policy).tier
    rule = next((rule for rule in policy.tiers if rule.name == tier), None)
    return None if rule is None else rule.min_network_mbps


def network_mbps(host: HostInfo | None) -> float | None:
    """The host's measured bandwidth as the tiers judge it: the slower direction; None until a test has run."""
    return _network_mbps(host)


def describe_tiers(policy: TierPolicy) -> list[TierJson]:
    """The tiers for GET /api/v1/tiers, each with the catalog models a healthy card of lands in it."""
    examples: dict[str, list[str]] = {rule.name: [] for rule in policy.tiers}
    for model in CATALOG.values():
        tier = classify(reference_gpu_info(model), policy).tier
        if tier is not None:
            examples[tier].append(model.key)
    return [
        {"name": rule.name, "description": rule.description, "criteria": rule.criteria(), "examples": examples[rule.name]}
        for rule in policy.tiers
    ]


# -- verification -------------------------------------------------------------------------------


def _verify(info: GpuInfo, model: GpuModel, policy: TierPolicy, measured: Mapping[str, float]) -> list[tuple[str, str]]:
    """(flag, reason) for each reported or measured fact that contradicts the claimed model."""
    problems = []
    # Compared without dividing: a reported value may be any integer, too large for a float.
    if abs(info.memory_total_mib - model.memory_mib) > policy.vram_tolerance * model.memory_mib:
        problems.append(
            (
                "vram_mismatch",
                f"reports {info.memory_total_mib} MiB of memory; a {model.name} has "
                f"about {model.memory_mib} MiB (tolerance {policy.vram_tolerance:.0%})",
            )
        )
    if _parse_cc(info.compute_capability) != _parse_cc(model.compute_capability):
        problems.append(
            (
                "compute_capability_mismatch",
                f"reports compute capability {info.compute_capability!r}; a {model.name} has {model.compute_capability}",
            )
        )
    if _active_nvlinks(info) and not model.nvlink:
        problems.append(("nvlink_mismatch", f"reports active NVLinks; a {model.name} has no NVLink"))
    if info.vendor != model.vendor:
        problems.append(("vendor_mismatch", f"reports vendor {info.vendor!r}; a {model.name} is made by {model.vendor}"))
    return problems + _verify_measured(model, policy, measured)


def _verify_measured(model: GpuModel, policy: TierPolicy, measured: Mapping[str, float]) -> list[tuple[str, str]]:
    problems = []
    for key, kind in MEASURED_FIGURES.items():
        value, expected = measured.get(key), getattr(model, key)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            problems.append(("invalid_measurement", f"measured {key} is {value!r}, not a usable figure"))
            continue
        fraction = policy.min_throughput_fraction if kind == "throughput" else policy.min_bandwidth_fraction
        if expected and value < fraction * expected:
            reason = (
                f"measured {key} {value:g} is {value / expected:.0%} of a {model.name}'s {expected:g} "
                f"(at least {fraction:.0%} expected)"
            )
            problems.append((f"{kind}_below_catalog", reason))
    return problems


# -- tier criteria ------------------------------------------------------------------------------


def _assign_tier(info: GpuInfo, model: GpuModel, policy: TierPolicy, host: HostInfo | None) -> Classification:
    facts = _facts(info, model, host)
    reasons = []
    for rule in policy.tiers:
        unmet = _unmet(rule, facts, nvlinked=bool(_active_nvlinks(info)), vendor=model.vendor)
        if not unmet:
            reasons.append(f"{model.name} meets every criterion of tier {rule.name!r}")
            return Classification(model.key, rule.name, (), tuple(reasons))
        reasons.append(f"not tier {rule.name!r}: {'; '.join(unmet)}")
    reasons.append(f"{model.name} meets no tier of the policy")
    return Classification(model.key, None, (), tuple(reasons))


def _facts(info: GpuInfo, model: GpuModel, host: HostInfo | None) -> GpuFacts:
    """The figure each ``min_*`` criterion is compared with; None means unknown, and the criterion is skipped."""
    return {
        "min_vram_gib": info.memory_total_mib / 1024,
        "min_fp16_tflops": model.fp16_tflops,
        "min_bf16_tflops": model.bf16_tflops or 0.0,  # no BF16 never meets a BF16 minimum
        "min_memory_bandwidth_gbs": model.memory_bandwidth_gbs,
        "min_compute_capability": _parse_cc(model.compute_capability),
        # NVML reports the live link; a card in a slower slot is judged by the slot.
        "min_pcie_gen": info.pcie_gen if info.pcie_gen is not None else model.pcie_gen,
        "min_pcie_width": info.pcie_width,
        "min_network_mbps": _network_mbps(host),
    }


def _unmet(rule: TierRule, facts: GpuFacts, *, nvlinked: bool, vendor: str) -> list[str]:
    unmet = []
    if rule.vendor is not None and vendor != rule.vendor:
        unmet.append(f"vendor {vendor} is not {rule.vendor}")
    for key, have in facts.items():
        need = getattr(rule, key)
        if key == "min_compute_capability" and need is not None and have is None:
            # A card without CUDA (AMD's) never meets a CUDA minimum, even in a policy that names no vendor.
            unmet.append("no CUDA compute capability")
            continue
        if need is None or have is None:
            continue
        if key == "min_compute_capability":
            need = _parse_cc(need)
        if have < need:
            label, unit = _LABELS[key]
            unmet.append(f"{label} {_show(have)} < {_show(need)} {unit}".rstrip())
    if rule.require_nvlink and not nvlinked:
        unmet.append("no active NVLink")
    return unmet


def _network_mbps(host: HostInfo | None) -> float | None:
    """The slower direction of the host's measured bandwidth; None until a test has run."""
    if host is None:
        return None
    known = [v for v in (host.bandwidth_mbps_down, host.bandwidth_mbps_up) if v is not None and math.isfinite(v)]
    return min(known) if known else None


# -- small helpers ------------------------------------------------------------------------------


def _rule(index: int, table: TomlTable) -> TierRule:
    where = f"tier {table.get('name')!r}" if isinstance(table.get("name"), str) else f"tier #{index + 1}"
    _reject_unknown(table, {f.name for f in fields(TierRule)}, where)
    if "name" not in table:
        raise ConfigError(f"{where}: missing key 'name'")
    try:
        return TierRule(**table)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _reject_unknown(table: TomlTable, known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")


def _check(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}")


def _parse_cc(text: str) -> tuple[int, int] | None:
    # Bounded digits: int() refuses very long digit strings, and a reported value may be anything.
    match = re.fullmatch(r"\s*(\d{1,4})\.(\d{1,4})\s*", text)
    return (int(match[1]), int(match[2])) if match else None


def _active_nvlinks(info: GpuInfo) -> int:
    return sum(1 for link in info.nvlinks if link.active)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ".".join(map(str, value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)
