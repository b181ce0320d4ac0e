"""One object for each value that many agents report alike (issue 42, point 2: the Master's memory per agent).

What the Master keeps of every agent is mostly what its hello said, decoded: a new string, number and NvLink object
per field of every GPU, though a fleet's cards say the same few things (an H100 SXM's name, driver, CUDA version,
PCI addresses and 18 NvLinks). Kept as decoded, the 8 GPU descriptions of one host were about 17 KB of the Master's
memory (bench/HISTORY.md, "The Master's memory per agent"); kept as one shared object per value, about 2 KB: only
each card's own UUID is its own.

``SharedValues.one(value)`` answers the first equal value it was given, of the same type (``1 == 1.0 == True``, but a
float must stay a float). What an agent reports is its own choice, so the pool is bounded: past ``limit`` values a
new one is kept as given, not pooled. A pooled value stays pooled after the last card that said it is gone, so hosts
that make values up cost the Master at most the pool's bound (at the wire's limits on each value, a few tens of MB),
and what they keep of their own as before. Only immutable values are pooled (strings, numbers, frozen structs and
tuples of them): a shared object must never be changed in place.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from common.inventory import GpuInfo, HostInfo, NvLink

# Distinct values a fleet reports alike: GPU names, drivers, CUDA versions, PCI addresses, NvLink layouts, CPU models,
# kernels; tens to a few thousand in practice. Each pooled value costs a dict entry (about 100 bytes) beside itself.
SHARED_VALUES_MAX = 65_536

_V = TypeVar("_V")


class SharedValues:
    """A bounded pool of equal immutable values, each kept once."""

    __slots__ = ("_kept", "limit")

    def __init__(self, limit: int = SHARED_VALUES_MAX) -> None:
        self._kept: dict[tuple[type, object], object] = {}
        self.limit = limit

    def __len__(self) -> int:
        return len(self._kept)

    def one(self, value: _V) -> _V:
        """The pooled value equal to ``value`` and of its type; ``value`` itself when none is (pooled now, unless the
        pool is full). ``value`` must be hashable and never changed in place."""
        key = (type(value), value)
        kept = self._kept.get(key)
        if kept is not None:
            return kept  # type: ignore[return-value]  # keyed by its type: the same type as ``value``
        if len(self._kept) < self.limit:
            self._kept[key] = value
        return value

    def known(self, value: _V) -> _V | None:
        """The pooled value equal to ``value`` and of its type, or None (nothing is pooled)."""
        return self._kept.get((type(value), value))  # type: ignore[return-value]  # keyed by its type

    def nvlinks(self, links: tuple[NvLink, ...]) -> tuple[NvLink, ...]:
        """``links`` as one shared tuple of shared links. A layout the pool holds already (each of a fleet's H100s says
        one of a few) is found by the tuple alone: its links were pooled with it, and looking each up first (18 hashes
        and lookups, then the tuple's) was most of a GPU's sharing, in a hello's handling."""
        if not links:
            return ()
        kept = self.known(links)
        if kept is not None:
            return kept
        return self.one(tuple(self.one(link) for link in links))

    def gpu_info(self, info: GpuInfo) -> GpuInfo:
        """An equal ``info`` whose every value but the card's own (its index, UUID and MIG instances) is a shared
        object."""
        one = self.one
        return msgspec.structs.replace(
            info,
            name=one(info.name),
            pci_bus_id=one(info.pci_bus_id),
            memory_total_mib=one(info.memory_total_mib),
            compute_capability=one(info.compute_capability),
            driver_version=one(info.driver_version),
            cuda_version=one(info.cuda_version),
            pcie_gen=one(info.pcie_gen),
            pcie_width=one(info.pcie_width),
            nvlinks=self.nvlinks(info.nvlinks),
            clock_sm_max_mhz=one(info.clock_sm_max_mhz),
            clock_mem_max_mhz=one(info.clock_mem_max_mhz),
            power_limit_w=one(info.power_limit_w),
            memory_bus_width_bits=one(info.memory_bus_width_bits),
            vendor=one(info.vendor),
            partition=one(info.partition),
        )

    def host(self, host: HostInfo | None) -> HostInfo | None:
        """An equal ``host`` whose values that hosts share (CPU model, OS, kernel, sizes) are shared objects; its
        hostname and free disk are its own."""
        if host is None:
            return None
        one = self.one
        return msgspec.structs.replace(
            host,
            cpu_model=one(host.cpu_model),
            cpu_cores=one(host.cpu_cores),
            ram_mib=one(host.ram_mib),
            disk_total_gib=one(host.disk_total_gib),
            os=one(host.os),
            kernel=one(host.kernel),
        )
