"""Telemetry: the latest sample of every GPU in memory, one-minute rollups persisted, and a short ring of recent
samples for the GPUs of the few hosts someone is watching (the console's live charts). Each host's readings of
itself (CPU, memory, disk, network) are rolled up by the minute alike (HostRollup)."""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from common.inventory import THROTTLE_REASONS, GpuSample, HostSample
from master.batches import DUTY, write_paced
from master.records import HostRollup, TelemetryRollup
from master.sharing import SharedValues
from master.store.base import Store

log = logging.getLogger(__name__)

# The figures of one GPU's minute, kept in one array of doubles rather than one Python number object each: 80,000
# GPUs hold two minutes each at a flush (the open one and the one ended), and the objects cost more than the numbers
# (an array of 18 is ~210 bytes; 18 float and int attributes were ~700, a third of the Master's memory per agent).
# Integers up to 2**53 are exact as doubles, far beyond any MiB sum or error counter of a minute.
(
    _SAMPLES,
    _UTIL_SUM,
    _UTIL_MAX,
    _MEM_SUM,
    _MEM_MAX,
    _TEMP_SUM,
    _TEMP_N,
    _TEMP_MAX,
    _POWER_SUM,
    _POWER_N,
    _POWER_MAX,
    _CLOCK_SM_SUM,
    _CLOCK_SM_N,
    _CLOCK_MEM_SUM,
    _CLOCK_MEM_N,
    _ECC_CORRECTED,
    _ECC_UNCORRECTED,
    _XID_COUNT,
) = range(18)
_FIGURES = 18
_EMPTY_MINUTE = array("d", bytes(8 * _FIGURES))

# A GPU's latest sample, packed after its open minute's figures in the GPU's slot (``_GpuNow``): its figures in
# GpuSample's order (ts, utilization, memory, temperature, power, SM clock, corrected and uncorrected ECC errors, memory
# clock, Xids), 0 where it said nothing and a bit in ``unsaid``. Kept as a struct with a Python number object per
# figure, it was about 300 bytes per GPU.
_LATEST_TS = _FIGURES
_LATEST = 10
_ROW = _FIGURES + _LATEST
_NO_TEMP, _NO_POWER, _NO_CLOCK_SM, _NO_CLOCK_MEM = 1, 2, 4, 8  # ``_GpuNow.unsaid``: which of them the sample left None
# Each figure's bit; a figure that may not be None has none (-64: such a sample is kept whole)
_UNSAID_BITS = (-64, -64, -64, _NO_TEMP, _NO_POWER, _NO_CLOCK_SM, -64, -64, _NO_CLOCK_MEM, -64)


class _Blocks:
    """Slots of ``width`` doubles, handed out from blocks of ``per_block`` slots: an array of its own per GPU costs
    about 90 bytes beside its figures (and an object the collector tracks), a block's is shared by all its slots. A
    slot is never handed out twice; a block is let go when nothing holds it any more. ``per_block`` is such that every
    slot's offset (``width`` times at most ``per_block - 1``) is below 257: CPython keeps those ints once."""

    __slots__ = ("width", "per_block", "_block", "_taken")

    def __init__(self, width: int, per_block: int) -> None:
        self.width, self.per_block = width, per_block
        self._block = array("d")
        self._taken = per_block  # the first ``take`` makes a block

    def take(self) -> tuple[array[float], int]:
        """A fresh slot (all zeros): its block, and its offset there."""
        if self._taken == self.per_block:
            self._block, self._taken = array("d", bytes(8 * self.width * self.per_block)), 0
        at = self._taken * self.width
        self._taken += 1
        return self._block, at


# Blocks of 8 GPUs' rows (offsets up to 196) and of 14 ended minutes (offsets up to 234).
_ROWS_PER_BLOCK = 8
_MINUTES_PER_BLOCK = 14


# The reasons NVML names, each kept as one string object: a minute's reasons are a tuple of these, not of the strings
# each frame decoded (tens of thousands of minutes name one); and each set of reasons is one shared tuple, not a tuple
# per GPU's minute (bounded: an agent may name reasons of its own).
_KNOWN_REASONS = {reason: reason for reason in THROTTLE_REASONS}
_REASON_SETS = SharedValues(limit=4_096)


def _merged_reasons(held: tuple[str, ...], named: tuple[str, ...]) -> tuple[str, ...]:
    """``held`` with the reasons of ``named`` it lacks, sorted; ``held`` itself when it lacks none (the usual case).

    A kept sample's reasons and a minute's are shared tuples (``kept_sample``, ``_REASON_SETS``): a GPU that names the
    same reasons all minute hands in the very tuple its minute holds, answered without a look at each reason (this
    was 4 % of a 30,000-agent Master's loop in the hold, bench/HISTORY.md)."""
    if named is held:
        return held
    for reason in named:
        if reason not in held:
            break
    else:
        return held
    return _REASON_SETS.one(tuple(sorted({*held, *(_KNOWN_REASONS.get(reason, reason) for reason in named)})))


# The minutes are out of the garbage collector's sight (``gc=False``: they hold strings, numbers, an array and a tuple,
# never a cycle). 80,000 of them a minute, each living one to two minutes, were the most of what each middle
# collection walked and the most of what it moved to the old generation, whose growth calls the full collections.
class _Minute(msgspec.Struct, gc=False):
    """One GPU's samples of one minute, summed up as they come (its figures from ``v[at]`` on, indexed by the names
    above; a maximum means nothing while its count is 0). ``throttle_reasons``: every reason a sample named, sorted (a
    tuple of a few shared strings is a quarter of a set's size; up to half the GPUs' minutes name one)."""

    uuid: str
    agent_id: str
    minute: int
    v: array[float]  # its block (``_Blocks``): the figures are ``v[at : at + _FIGURES]``
    at: int
    throttle_reasons: tuple[str, ...] = ()

    def add(self, s: GpuSample) -> None:
        _add_figures(self.v, self.at, s)
        if s.throttle_reasons:
            self.throttle_reasons = _merged_reasons(self.throttle_reasons, s.throttle_reasons)


def _add_figures(v: array[float], at: int, s: GpuSample) -> None:
    """``s`` summed into the minute's figures ``v[at : at + _FIGURES]``."""
    v[at + _SAMPLES] += 1
    utilization = s.utilization_pct
    v[at + _UTIL_SUM] += utilization
    if utilization > v[at + _UTIL_MAX]:
        v[at + _UTIL_MAX] = utilization
    memory = s.memory_used_mib
    v[at + _MEM_SUM] += memory
    if memory > v[at + _MEM_MAX]:
        v[at + _MEM_MAX] = memory
    temperature = s.temperature_c
    if temperature is not None:
        if not v[at + _TEMP_N] or temperature > v[at + _TEMP_MAX]:
            v[at + _TEMP_MAX] = temperature
        v[at + _TEMP_SUM] += temperature
        v[at + _TEMP_N] += 1
    power = s.power_w
    if power is not None:
        if not v[at + _POWER_N] or power > v[at + _POWER_MAX]:
            v[at + _POWER_MAX] = power
        v[at + _POWER_SUM] += power
        v[at + _POWER_N] += 1
    if s.clock_sm_mhz is not None:
        v[at + _CLOCK_SM_SUM] += s.clock_sm_mhz
        v[at + _CLOCK_SM_N] += 1
    if s.clock_mem_mhz is not None:
        v[at + _CLOCK_MEM_SUM] += s.clock_mem_mhz
        v[at + _CLOCK_MEM_N] += 1
    if s.ecc_corrected > v[at + _ECC_CORRECTED]:
        v[at + _ECC_CORRECTED] = s.ecc_corrected
    if s.ecc_uncorrected > v[at + _ECC_UNCORRECTED]:
        v[at + _ECC_UNCORRECTED] = s.ecc_uncorrected
    if s.xid_count > v[at + _XID_COUNT]:
        v[at + _XID_COUNT] = s.xid_count


class _GpuNow(msgspec.Struct, gc=False):
    """One GPU's open minute and latest sample, as doubles in its slot of a block (``v[at : at + _ROW]``: the minute's
    figures, indexed as ``_Minute``'s, then the latest sample's from ``_LATEST_TS``). ``minute``: the open minute's number,
    None while none is open (a flush took it); ``agent_id``: the agent whose sample opened it. ``reasons``: the latest
    sample's throttle reasons; ``odd``: the latest sample itself when its figures would not come back equal from
    doubles (never a sample the Master took), else None.

    Kept so rather than as a sample struct with a Python number per figure and a ``_Minute`` with an array of its own:
    about 360 bytes a GPU instead of 670 (bench/HISTORY.md, "The Master's memory per agent, part two"). Out of the
    collector's sight, as the minutes are."""

    uuid: str
    agent_id: str
    v: array[float]
    at: int
    minute: int | None = None
    minute_reasons: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    unsaid: int = 0  # the latest sample's optional figures it left unsaid (None), as _NO_* bits
    odd: GpuSample | None = None

    def keep(self, s: GpuSample) -> None:
        """``s`` is this GPU's latest sample now. Its figures are packed, and kept whole instead where one would not come
        back as itself (NaN, an integer beyond 2**53: never in a sample the Master took, plausible_gpu bounds them)."""
        figures = msgspec.structs.astuple(s)[1 : 1 + _LATEST]
        unsaid = 0
        try:
            try:
                packed = array("d", figures)
            except TypeError:  # a figure left unsaid (None): packed as 0, its bit set
                unsaid = sum(bit for figure, bit in zip(figures, _UNSAID_BITS, strict=True) if figure is None)
                figures = tuple(0 if figure is None else figure for figure in figures)
                packed = array("d", figures)
        except (OverflowError, TypeError):  # beyond any double, or not a number
            packed = None
        if packed is None or packed.tolist() != list(figures) or unsaid < 0:
            self.odd = s
            return
        at = self.at + _LATEST_TS
        self.v[at : at + _LATEST] = packed
        self.odd, self.unsaid, self.reasons = None, unsaid, s.throttle_reasons

    def latest(self) -> GpuSample:
        """The latest sample, equal to the one kept (naming the GPU by the UUID string its first sample gave)."""
        if self.odd is not None:
            return self.odd
        at = self.at + _LATEST_TS
        ts, utilization, memory, temperature, power, clock_sm, ecc_corrected, ecc_uncorrected, clock_mem, xid = self.v[
            at : at + _LATEST
        ].tolist()
        unsaid = self.unsaid
        return GpuSample(
            uuid=self.uuid,
            ts=ts,
            utilization_pct=utilization,
            memory_used_mib=int(memory),
            temperature_c=None if unsaid & _NO_TEMP else temperature,
            power_w=None if unsaid & _NO_POWER else power,
            clock_sm_mhz=None if unsaid & _NO_CLOCK_SM else int(clock_sm),
            ecc_corrected=int(ecc_corrected),
            ecc_uncorrected=int(ecc_uncorrected),
            clock_mem_mhz=None if unsaid & _NO_CLOCK_MEM else int(clock_mem),
            xid_count=int(xid),
            throttle_reasons=self.reasons,
        )

    def usage(self) -> tuple[float, int]:
        """The latest sample's utilization and memory used, read without making the sample (the fleet's figures read
        these two of every GPU)."""
        if self.odd is not None:
            return self.odd.utilization_pct, self.odd.memory_used_mib
        at = self.at + _LATEST_TS + 1  # after its ts: utilization, then memory used (``latest``)
        v = self.v
        return v[at], int(v[at + 1])

    def add(self, s: GpuSample) -> None:
        """``s`` summed into the open minute."""
        _add_figures(self.v, self.at, s)
        if s.throttle_reasons:
            self.minute_reasons = _merged_reasons(self.minute_reasons, s.throttle_reasons)

    def close(self, slots: _Blocks) -> _Minute:
        """The open minute, taken out as a ``_Minute`` in a slot of ``slots`` (none is open after)."""
        assert self.minute is not None
        v, at = self.v, self.at
        block, to = slots.take()
        block[to : to + _FIGURES] = v[at : at + _FIGURES]
        v[at : at + _FIGURES] = _EMPTY_MINUTE
        ended = _Minute(self.uuid, self.agent_id, self.minute, block, to, self.minute_reasons)
        self.minute, self.minute_reasons = None, ()
        return ended


class LatestSamples(Mapping[str, GpuSample]):
    """Each GPU's latest sample by UUID, read from the telemetry's packed figures (a sample is made at each read)."""

    __slots__ = ("_gpus",)

    def __init__(self, gpus: dict[str, _GpuNow]) -> None:
        self._gpus = gpus

    def __getitem__(self, uuid: str) -> GpuSample:
        return self._gpus[uuid].latest()

    def get(self, uuid: str, default: GpuSample | None = None) -> GpuSample | None:  # type: ignore[override]
        gpu = self._gpus.get(uuid)
        return default if gpu is None else gpu.latest()

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._gpus

    def usage(self, uuid: str) -> tuple[float, int] | None:
        """The GPU's latest utilization and memory used (``_GpuNow.usage``); None for a GPU with no sample."""
        gpu = self._gpus.get(uuid)
        return None if gpu is None else gpu.usage()

    def __iter__(self) -> Iterator[str]:
        return iter(self._gpus)

    def __len__(self) -> int:
        return len(self._gpus)


# A step of a host's network counters over a longer gap than this (the host, its link or the Master was away) is not
# counted: its bytes cannot be placed in one minute, and counted in the later sample's they would show as a spike.
NET_STEP_MAX_S = 300.0


# What a host says of itself is taken from an untrusted host, and one rollup the store refuses (an integer beyond 64
# bits, an infinite average) would hold every host's minutes back at each flush. So a reading outside these bounds is
# taken as not said, a sample dated outside them is dropped, and a counter step faster than NET_MAX_BYTES_PER_S (8
# Tbit/s, every NIC of a large host at once) is not counted.
READING_MAX = 1e12  # percent, load, MiB, GiB: far above any real host's
COUNTER_MAX = 2**64  # the network counters are unsigned 64-bit
TS_MAX = 1e11  # unix seconds (the year 5138), as the API's windows are bounded
NET_MAX_BYTES_PER_S = 1e12
_READINGS = ("cpu_pct", "load_1m", "ram_used_mib", "ram_total_mib", "disk_used_gib", "disk_free_gib")
_COUNTERS = ("net_rx_bytes", "net_tx_bytes")


def plausible(sample: HostSample) -> HostSample | None:
    """``sample`` with its out-of-bounds readings as None; None for a sample dated outside [0, TS_MAX)."""
    if not 0 <= sample.ts < TS_MAX:
        return None
    unsaid: dict[str, None] = {}
    for name in _READINGS:
        value = getattr(sample, name)
        if value is not None and not 0 <= value <= READING_MAX:
            unsaid[name] = None
    for name in _COUNTERS:
        value = getattr(sample, name)
        if value is not None and not 0 <= value < COUNTER_MAX:
            unsaid[name] = None
    return msgspec.structs.replace(sample, **unsaid) if unsaid else sample


# A GPU's sample is taken from an untrusted host too: one figure beyond what a GPU can show poisons the fleet's means
# (a utilization of 1e308 in a group of honest H100s) and one date beyond the store's integers held every flush back
# (docs/master.md, "What the Master trusts from an agent"). A sample whose date, utilization, memory or counters are
# out of bounds is set aside whole (those figures have no "not said"); an optional reading (temperature, power,
# clocks) out of its physical range is taken as not said, as a host's readings are.
GPU_TEMPERATURE_C = (-60.0, 150.0)  # below any cooling, above any GPU's thermal shutdown
GPU_POWER_MAX_W = 5_000.0  # several times the largest board's limit (about 1,200 W today)
GPU_CLOCK_MAX_MHZ = 50_000  # memory clocks of GDDR7 cards read near 15,000 MHz
GPU_COUNTER_MAX = 2**53  # ECC and Xid counters: exact in the rollups' doubles and in any store's integers


@dataclass(frozen=True, slots=True)
class SampleWindow:
    """How far a GPU sample's date may be from the Master's clock: samples a relay buffered while the Master was away
    are late by minutes, an agent's clock may run a little ahead; further than this is no reading of now."""

    max_age_s: float
    max_ahead_s: float


@dataclass(frozen=True, slots=True)
class SetAside:
    """A GPU sample not taken, and why: ``figure`` names what was out of bounds (a bounded set, a metric label)."""

    figure: str  # "ts", "utilization_pct", "memory_used_mib" or "counters"
    detail: str


def plausible_gpu(sample: GpuSample, memory_total_mib: int, now: float, window: SampleWindow) -> GpuSample | SetAside:
    """``sample`` as the Master takes it (out-of-range optional readings as None), or why it is set aside.

    ``memory_total_mib``: the GPU's memory as its host's hello reported it, the ceiling of its memory use. Never
    raises: NaN and infinities fail every comparison and land outside the bounds."""
    if not now - window.max_age_s <= sample.ts <= now + window.max_ahead_s:
        return SetAside("ts", f"dated {sample.ts!r}, {now - sample.ts!r} s from the Master's clock")
    if not 0.0 <= sample.utilization_pct <= 100.0:
        return SetAside("utilization_pct", f"utilization {sample.utilization_pct!r} % is outside 0..100")
    if not 0 <= sample.memory_used_mib <= memory_total_mib:
        return SetAside("memory_used_mib", f"memory used {sample.memory_used_mib!r} MiB is outside 0..{memory_total_mib}")
    for counter in (sample.ecc_corrected, sample.ecc_uncorrected, sample.xid_count):
        if not 0 <= counter < GPU_COUNTER_MAX:
            return SetAside("counters", f"an ECC or Xid counter of {counter!r} is outside 0..2**53")
    unsaid: dict[str, None] = {}
    low, high = GPU_TEMPERATURE_C
    if sample.temperature_c is not None and not low <= sample.temperature_c <= high:
        unsaid["temperature_c"] = None
    if sample.power_w is not None and not 0.0 <= sample.power_w <= GPU_POWER_MAX_W:
        unsaid["power_w"] = None
    if sample.clock_sm_mhz is not None and not 0 <= sample.clock_sm_mhz <= GPU_CLOCK_MAX_MHZ:
        unsaid["clock_sm_mhz"] = None
    if sample.clock_mem_mhz is not None and not 0 <= sample.clock_mem_mhz <= GPU_CLOCK_MAX_MHZ:
        unsaid["clock_mem_mhz"] = None
    return msgspec.structs.replace(sample, **unsaid) if unsaid else sample


def kept_sample(sample: GpuSample, uuid: str) -> GpuSample:
    """``sample`` as the Master keeps it (its GPU's latest, and its minute's first): naming its GPU by ``uuid``, the
    registry's own string of it, and its throttle reasons as a shared tuple. As decoded, each kept sample held a UUID
    string and a tuple of reasons of its own, and its GPU's minute another copy of the UUID: about 300 bytes per GPU."""
    reasons = sample.throttle_reasons
    if reasons:  # in the agent's order, each a shared string
        reasons = _REASON_SETS.known(reasons) or _REASON_SETS.one(tuple(_KNOWN_REASONS.get(r, r) for r in reasons))
    return msgspec.structs.replace(sample, uuid=uuid, throttle_reasons=reasons)


def counter_step(previous: int | None, current: int | None, gap_s: float) -> int | None:
    """The bytes a counter since boot moved between two consecutive samples ``gap_s`` apart: None where either
    reading is missing, the gap is too long to place them or the step too large to be real; 0 where it went
    backwards (the host rebooted)."""
    if previous is None or current is None or gap_s > NET_STEP_MAX_S:
        return None
    step = max(0, current - previous)
    return None if step > NET_MAX_BYTES_PER_S * max(gap_s, 1.0) else step


class _HostMinute(msgspec.Struct, gc=False):
    """One host's samples of itself in one minute, summed up as they come (about 300 bytes: docs/monitoring.md)."""

    agent_id: str
    minute: int
    samples: int = 0
    last_ts: float = 0.0  # the latest sample's: its total memory is the minute's
    cpu_sum: float = 0.0
    cpu_n: int = 0
    cpu_max: float | None = None
    load_sum: float = 0.0
    load_n: int = 0
    ram_sum: int = 0
    ram_n: int = 0
    ram_max: int | None = None
    ram_total: int | None = None
    disk_used_max: float | None = None
    disk_free_min: float | None = None
    net_rx: int | None = None
    net_tx: int | None = None

    def add(self, s: HostSample, rx: int | None, tx: int | None) -> None:
        self.samples += 1
        if s.cpu_pct is not None:
            self.cpu_sum += s.cpu_pct
            self.cpu_n += 1
            if self.cpu_max is None or s.cpu_pct > self.cpu_max:
                self.cpu_max = s.cpu_pct
        if s.load_1m is not None:
            self.load_sum += s.load_1m
            self.load_n += 1
        if s.ram_used_mib is not None:
            self.ram_sum += s.ram_used_mib
            self.ram_n += 1
            if self.ram_max is None or s.ram_used_mib > self.ram_max:
                self.ram_max = s.ram_used_mib
        if s.ram_total_mib is not None and s.ts >= self.last_ts:
            self.ram_total = s.ram_total_mib
        self.last_ts = max(self.last_ts, s.ts)
        if s.disk_used_gib is not None and (self.disk_used_max is None or s.disk_used_gib > self.disk_used_max):
            self.disk_used_max = s.disk_used_gib
        if s.disk_free_gib is not None and (self.disk_free_min is None or s.disk_free_gib < self.disk_free_min):
            self.disk_free_min = s.disk_free_gib
        if rx is not None:
            self.net_rx = (self.net_rx or 0) + rx
        if tx is not None:
            self.net_tx = (self.net_tx or 0) + tx

    def rollup(self) -> HostRollup:
        return HostRollup(
            agent_id=self.agent_id,
            minute=self.minute,
            samples=self.samples,
            cpu_pct_avg=round(self.cpu_sum / self.cpu_n, 2) if self.cpu_n else None,
            cpu_pct_max=self.cpu_max,
            load_1m_avg=round(self.load_sum / self.load_n, 2) if self.load_n else None,
            ram_used_mib_avg=round(self.ram_sum / self.ram_n, 2) if self.ram_n else None,
            ram_used_mib_max=self.ram_max,
            ram_total_mib=self.ram_total,
            disk_used_gib=self.disk_used_max,
            disk_free_gib_min=self.disk_free_min,
            net_rx_bytes=self.net_rx,
            net_tx_bytes=self.net_tx,
        )


# The live charts' memory, bounded twice: a ring of at most RECENT_SAMPLES samples per GPU, kept only for the GPUs of
# at most WATCHED_AGENTS hosts that were watched (asked for) in the last WATCH_S seconds. Keeping a ring for every GPU
# of a 10,000-host fleet would cost about a gigabyte; a watched host costs 8 x 120 samples.
RECENT_SAMPLES = 120
WATCHED_AGENTS = 64
WATCH_S = 600.0


@dataclass
class RecentSamples:
    """Rings of recent samples per GPU of the watched hosts. A host is watched from the first ``watch`` on (its ring
    starts with the latest sample the caller passes) until WATCH_S pass without another, or until WATCHED_AGENTS
    others were watched more recently: then its rings are dropped."""

    per_gpu: int = RECENT_SAMPLES
    max_agents: int = WATCHED_AGENTS
    watch_s: float = WATCH_S
    _watched: OrderedDict[str, float] = field(default_factory=OrderedDict)  # agent id -> last watched, oldest first
    _rings: dict[str, dict[str, deque[GpuSample]]] = field(default_factory=dict)  # agent id -> uuid -> samples

    def watch(self, agent_id: str, now: float, latest: Iterable[GpuSample] = ()) -> None:
        """Keep (or go on keeping) ``agent_id``'s samples; ``latest``: its GPUs' latest samples, to start from."""
        self._watched[agent_id] = now
        self._watched.move_to_end(agent_id)
        rings = self._rings.setdefault(agent_id, {})
        for sample in latest:
            if sample.uuid not in rings:
                rings[sample.uuid] = deque([sample], maxlen=self.per_gpu)
        while len(self._watched) > self.max_agents:
            oldest, _ = self._watched.popitem(last=False)
            self._rings.pop(oldest, None)
        for agent, seen in list(self._watched.items()):
            if now - seen <= self.watch_s:
                break  # ordered by last watched: the rest are more recent
            del self._watched[agent]
            self._rings.pop(agent, None)

    def add(self, agent_id: str, samples: Sequence[GpuSample]) -> None:
        rings = self._rings.get(agent_id)
        if rings is None:
            return
        for sample in samples:
            ring = rings.get(sample.uuid)
            if ring is None:
                ring = rings[sample.uuid] = deque(maxlen=self.per_gpu)
            if not ring or sample.ts > ring[-1].ts:  # a late or repeated sample is not charted twice
                ring.append(sample)

    def of(self, agent_id: str) -> dict[str, list[GpuSample]]:
        """The host's recent samples per GPU uuid, oldest first ({} when it is not watched)."""
        return {uuid: list(ring) for uuid, ring in self._rings.get(agent_id, {}).items()}

    @property
    def watched(self) -> list[str]:
        return list(self._watched)


_Rollup = TypeVar("_Rollup", TelemetryRollup, HostRollup)


async def put_sound(put_many: Callable[[list[_Rollup]], Awaitable[None]], rollups: list[_Rollup]) -> int:
    """``put_many(rollups)``; when the store refuses a record's figures (OverflowError: an integer beyond 64 bits,
    which no bound above lets through, kept as the last guard), each record is written on its own and those the
    store refuses are set aside, logged, and counted in the answer: retried, one would hold every other back forever.
    Any other error (the store away) is raised, and the caller keeps the batch for its next flush."""
    try:
        await put_many(rollups)
        return 0
    except OverflowError:
        pass
    refused = 0
    for rollup in rollups:
        try:
            await put_many([rollup])
        except OverflowError as exc:
            refused += 1
            log.error(
                "telemetry: the store refused a rollup's figures; set aside", extra={"rollup": repr(rollup), "why": str(exc)}
            )
    return refused


@dataclass
class TelemetryAggregator:
    """Memory: per GPU (``_gpus``, by UUID) its latest sample and its open minute, packed (``_GpuNow``); a sample of a
    later minute moves the open one to ``_ended``, by minute then UUID, until the next flush writes it. A late sample
    (out of order) of an ended minute is added to it there. A host's own samples are rolled up alike, by agent id
    (``_host_open``, ``_host_ended``).

    At 10,000 agents these are the Master's largest per-GPU state (80,000 latest samples and open minutes, up to as
    many ended minutes until a flush has written them), so each is kept small: every minute of a GPU holds the one
    UUID string its first sample gave (not the string of each frame decoded), ``_ended`` is keyed without a tuple and
    a number object per entry, and throttle reasons are a tuple of shared strings."""

    store: Store
    _gpus: dict[str, _GpuNow] = field(default_factory=dict)  # by UUID: each GPU's latest sample and open minute
    _rows: _Blocks = field(default_factory=lambda: _Blocks(_ROW, _ROWS_PER_BLOCK))  # the figures of ``_gpus``
    _minutes: _Blocks = field(default_factory=lambda: _Blocks(_FIGURES, _MINUTES_PER_BLOCK))  # those of ended minutes
    _ended: dict[int, dict[str, _Minute]] = field(default_factory=dict)  # minute -> UUID -> its minute
    _unwritten: list[TelemetryRollup] = field(default_factory=list)  # a failed flush's rest, tried again first
    _number: int = -1  # the latest minute's number, the one int object the GPUs' minutes of it hold (``_shared``)
    recent: RecentSamples = field(default_factory=RecentSamples)  # the watched hosts' recent samples
    # Each host's latest sample of itself (CPU, memory, disk, network), by agent id; also the previous counters its
    # next sample's network bytes are counted from.
    latest_hosts: dict[str, HostSample] = field(default_factory=dict)
    # A host's minutes, as the GPUs' above: one open per host, the ended ones until the next flush writes them.
    _host_open: dict[str, _HostMinute] = field(default_factory=dict)
    _host_ended: dict[tuple[str, int], _HostMinute] = field(default_factory=dict)
    _host_unwritten: list[HostRollup] = field(default_factory=list)
    set_aside: int = 0  # rollups the store refused (put_sound), since this process started
    # Minutes (unix time // 60) in which telemetry was paced or shed (issue 29), with the largest slowdown told then
    # (0: shed, not paced): their rollups are marked thinner. One entry per such minute, dropped once written.
    thin_minutes: dict[int, float] = field(default_factory=dict)

    def note_thinning(self, now: float, factor: float, shed: bool) -> None:
        """Telemetry is being paced (``factor`` > 1) or shed now: this minute's rollups will say so."""
        if factor <= 1.0 and not shed:
            return
        minute = int(now // 60)
        told = factor if factor > 1.0 else 0.0
        self.thin_minutes[minute] = max(self.thin_minutes.get(minute, told), told)

    def ingest_host(self, agent_id: str, sample: HostSample) -> None:
        """Add ``sample`` to the host's minute, and keep it as the host's latest unless a later one is kept already
        (a late frame: added to its own minute, its network counters not counted; a repeated one: ignored). Readings
        out of bounds are taken as not said (``plausible``)."""
        checked = plausible(sample)
        if checked is None:
            return
        sample = checked
        kept = self.latest_hosts.get(agent_id)
        if kept is not None and sample.ts == kept.ts:
            return
        rx = tx = None
        if kept is None or sample.ts > kept.ts:
            self.latest_hosts[agent_id] = sample
            if kept is not None:
                gap = sample.ts - kept.ts
                rx = counter_step(kept.net_rx_bytes, sample.net_rx_bytes, gap)
                tx = counter_step(kept.net_tx_bytes, sample.net_tx_bytes, gap)
        number = int(sample.ts // 60)
        minute = self._host_open.get(agent_id)
        if minute is None or minute.minute < number:
            if minute is not None:
                self._host_ended[(agent_id, minute.minute)] = minute
            minute = self._host_open[agent_id] = _HostMinute(agent_id, number)
        elif minute.minute > number:
            ended = self._host_ended.get((agent_id, number))
            if ended is None:
                ended = self._host_ended[(agent_id, number)] = _HostMinute(agent_id, number)
            minute = ended
        minute.add(sample, rx, tx)

    @property
    def latest(self) -> LatestSamples:
        """Each GPU's latest sample to arrive, by UUID."""
        return LatestSamples(self._gpus)

    def usage(self, uuid: str) -> tuple[float, int] | None:
        """A GPU's latest utilization and memory used, its sample not made (``LatestSamples.usage``)."""
        gpu = self._gpus.get(uuid)
        return None if gpu is None else gpu.usage()

    def ingest(self, agent_id: str, samples: Iterable[GpuSample]) -> None:
        batch = list(samples)
        self.recent.add(agent_id, batch)
        gpus = self._gpus
        for sample in batch:
            uuid = sample.uuid
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _GpuNow(uuid, agent_id, *self._rows.take())
            gpu.keep(sample)
            number = int(sample.ts // 60)
            if gpu.minute is not None and gpu.minute > number:  # a late sample: to its ended minute
                ended_then = self._ended.setdefault(number, {})
                ended = ended_then.get(uuid)
                if ended is None:
                    ended = ended_then[gpu.uuid] = _Minute(gpu.uuid, agent_id, number, *self._minutes.take())
                ended.add(sample)
                continue
            if gpu.minute is not None and gpu.minute < number:
                self._end(gpu.close(self._minutes))
            if gpu.minute is None:
                gpu.agent_id, gpu.minute = agent_id, self._shared(number)
            gpu.add(sample)

    def _shared(self, number: int) -> int:
        """``number``, the minute a GPU's new minute is of, as one int object for every GPU's minute of it (80,000 GPUs
        start a minute together; an int of each was 2.5 MB)."""
        if number != self._number:
            self._number = number
        return self._number

    def _end(self, minute: _Minute) -> None:
        """``minute`` is over: it waits in ``_ended`` for the next flush."""
        ended_then = self._ended.get(minute.minute)
        if ended_then is None:
            ended_then = self._ended[minute.minute] = {}
        ended_then[minute.uuid] = minute

    async def flush(self, now: float, *, everything: bool = False, duty: float | None = None, spread_s: float = 0.0) -> int:
        """Persist the minutes that are over (all of them on shutdown); returns how many rollups were written.

        Paced (master/batches.py): a minute of 10,000 agents is 80,000 rollups, which written at once would
        stall every frame and command behind them for seconds. Each batch's rollups are made when it is written,
        not all at once (80,000 of them would hold the event loop for a quarter of a second). ``duty``: the
        pacing's (default: rest as long as each batch took; none when everything is flushed on shutdown).
        ``spread_s``: the GPUs' rollups are spread over about that long, the hosts' over the same share of it as
        their number is of the GPUs' (write_paced); not on shutdown.
        """
        current = int(now // 60)
        # Each minute is let go (None) as soon as its rollup is made: a spread flush lasts half a minute, and holding
        # the whole of the last minute meanwhile would keep two minutes of 80,000 GPUs in memory at once.
        done: list[_Minute | None] = [minute for ended_then in self._ended.values() for minute in ended_then.values()]
        for gpu in self._gpus.values():
            if gpu.minute is not None and (everything or gpu.minute < current):
                done.append(gpu.close(self._minutes))
        gpus = len(done)
        self._ended = {}
        retry, self._unwritten = self._unwritten, []
        if duty is None:
            duty = 1.0 if everything else DUTY
        if everything:
            spread_s = 0.0
        written = 0

        async def put(rollups: list[TelemetryRollup]) -> None:
            nonlocal written
            try:
                refused = await put_sound(self.store.rollups.put_many, rollups)
            except BaseException:
                self._unwritten.extend(rollups)  # kept for the next flush (upserts: no doubles)
                raise
            self.set_aside += refused
            written += len(rollups) - refused

        consumed = 0  # minutes of ``done`` made into rollups so far

        async def write(minutes: Sequence[_Minute | None]) -> None:
            nonlocal consumed
            start, consumed = consumed, consumed + len(minutes)
            rollups = [self._rollup(m) for m in minutes if m is not None]
            done[start:consumed] = [None] * (consumed - start)
            if self.thin_minutes:
                for rollup in rollups:
                    rollup.thinned = self.thin_minutes.get(rollup.minute, 1.0)
            await put(rollups)

        try:
            if retry:
                await put(retry)  # a failed batch of an earlier flush
            await write_paced(done, write, duty=duty, spread_s=spread_s)
        except BaseException:
            for left in done[consumed:]:  # not reached: written by the next flush
                if left is not None:
                    self._end(left)
            raise
        if self.thin_minutes:  # an hour back still marks a late sample's minute
            self.thin_minutes = {m: f for m, f in self.thin_minutes.items() if m >= current - 60}
        return written + await self._flush_hosts(current, everything=everything, duty=duty, spread_s=spread_s, gpus=gpus)

    async def _flush_hosts(self, current: int, *, everything: bool, duty: float, spread_s: float, gpus: int) -> int:
        """``flush`` for the hosts' own minutes, paced and retried alike; returns how many host rollups were written.
        ``spread_s``: the GPUs' (``gpus`` rollups were written over it), shared out by number."""
        over = [m for m in self._host_open.values() if everything or m.minute < current]
        for minute in over:
            del self._host_open[minute.agent_id]
        done = [*self._host_ended.values(), *over]
        self._host_ended = {}
        retry, self._host_unwritten = self._host_unwritten, []
        written = consumed = 0

        async def put(rollups: list[HostRollup]) -> None:
            nonlocal written
            try:
                refused = await put_sound(self.store.host_rollups.put_many, rollups)
            except BaseException:
                self._host_unwritten.extend(rollups)
                raise
            self.set_aside += refused
            written += len(rollups) - refused

        async def write(minutes: Sequence[_HostMinute]) -> None:
            nonlocal consumed
            consumed += len(minutes)
            await put([m.rollup() for m in minutes])

        try:
            if retry:
                await put(retry)
            await write_paced(done, write, duty=duty, spread_s=spread_s * min(1.0, len(done) / gpus) if gpus else 0.0)
        except BaseException:
            for minute in done[consumed:]:
                self._host_ended[(minute.agent_id, minute.minute)] = minute
            raise
        return written

    @staticmethod
    def _rollup(m: _Minute) -> TelemetryRollup:
        v = m.v[m.at : m.at + _FIGURES]
        samples = int(v[_SAMPLES])

        def mean(total: int, count: int) -> float | None:
            return round(v[total] / v[count], 2) if v[count] else None

        return TelemetryRollup(
            gpu_uuid=m.uuid,
            agent_id=m.agent_id,
            minute=m.minute,
            samples=samples,
            utilization_avg=round(v[_UTIL_SUM] / samples, 2),
            utilization_max=v[_UTIL_MAX],
            memory_used_mib_max=int(v[_MEM_MAX]),
            temperature_max=v[_TEMP_MAX] if v[_TEMP_N] else None,
            power_avg_w=mean(_POWER_SUM, _POWER_N),
            ecc_uncorrected=int(v[_ECC_UNCORRECTED]),
            memory_used_mib_avg=round(v[_MEM_SUM] / samples, 2),
            temperature_avg=mean(_TEMP_SUM, _TEMP_N),
            power_max_w=v[_POWER_MAX] if v[_POWER_N] else None,
            clock_sm_avg_mhz=mean(_CLOCK_SM_SUM, _CLOCK_SM_N),
            clock_mem_avg_mhz=mean(_CLOCK_MEM_SUM, _CLOCK_MEM_N),
            ecc_corrected=int(v[_ECC_CORRECTED]),
            xid_count=int(v[_XID_COUNT]),
            throttle_reasons=list(m.throttle_reasons),
        )
