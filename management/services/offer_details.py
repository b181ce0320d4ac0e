"""One offer in detail, for the renter deciding whether to rent it (``MarketService.offer_detail``): the offer, the host's
facts (CPU, RAM, disk, network), each of its GPUs (model, memory, driver, CUDA, PCIe, tier, state, measured figures),
the price in force, and the offer's history: prices and availability (management/market/offer_history.py).

What a renter sees here is what offers already publish, in more detail: no provider's account, no other renter, no
workload. The history is read from the Master's events (``price.changed``, ``agent.transition``), newest kept, with a
bound on how many are read so that a host with a long life costs a bounded amount per page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.inventory import HostInfo
from management.market.market import Market
from management.market.offer_history import (
    PriceChange,
    PricePoint,
    StateSpan,
    Transition,
    available_share,
    price_points,
    state_spans,
)
from management.market.offers import Offer
from management.market.prices import HostPrice
from management.services.prices import PRICE_CHANGED
from master.port import EventRecord, GpuRecord, MasterPort, measured_verified, verification_label

TRANSITION = "agent.transition"
AVAILABILITY_WINDOW_S = 7 * 86400.0
EVENTS_PAGE = 1000
EVENTS_READ_MAX = 20_000  # per subject and kind: a host's transitions over a long life; the newest are what count
PRICE_POINTS_SHOWN = 50


@dataclass(frozen=True)
class GpuFacts:
    index: int
    model: str  # catalog key, or NVML's name when not in the catalog
    name: str  # as NVML reports it
    memory_gib: float
    driver: str
    cuda: str
    compute_capability: str
    pcie: str  # "Gen 5 x16", "" when not reported
    nvlinks: int
    tier: str
    state: str
    offered: bool  # its host may rent it out (healthy, not flagged); ``state`` says whether it is free now
    verification: str  # "verified", "unmeasured", "simulated", "failed: ..."
    # Measured by the latest passed verification run (docs/verification.md); None: not verified by measurement.
    tflops: float | None  # dense FP16/BF16 tensor
    fp32_tflops: float | None
    memory_bandwidth_gbs: float | None  # device copy, read + write
    h2d_gbs: float | None  # pinned host to device
    measured_at: float | None


@dataclass(frozen=True)
class OfferDetail:
    offer: Offer
    host: HostInfo | None  # None: the host has not reported its facts
    gpus: list[GpuFacts]
    price: HostPrice
    prices: list[PricePoint]  # oldest first, the last PRICE_POINTS_SHOWN
    spans: list[StateSpan]  # the availability window, oldest first
    available_share: float | None  # of the window, in an offering state
    window_s: float
    currency: str


def gpu_facts(gpu: GpuRecord, offered: bool) -> GpuFacts:
    info = gpu.info
    v = gpu.verification
    figures = v.figures if v is not None and measured_verified(gpu) else None
    tflops = max(figures.bf16_tflops or 0.0, figures.fp16_tflops or 0.0) if figures is not None else 0.0
    return GpuFacts(
        index=gpu.index,
        model=gpu.model or info.name,
        name=info.name,
        memory_gib=round(info.memory_total_mib / 1024, 1),
        driver=info.driver_version,
        cuda=info.cuda_version,
        compute_capability=info.compute_capability,
        pcie=f"Gen {info.pcie_gen} x{info.pcie_width}" if info.pcie_gen and info.pcie_width else "",
        nvlinks=len(info.nvlinks),
        tier=gpu.tier or "",
        state=gpu.state,
        offered=offered,
        verification=verification_label(gpu),
        tflops=tflops or None,
        fp32_tflops=figures.fp32_tflops if figures is not None else None,
        memory_bandwidth_gbs=figures.memory_bandwidth_gbs if figures is not None else None,
        h2d_gbs=figures.h2d_gbs if figures is not None else None,
        measured_at=v.at if figures is not None and v is not None else None,
    )


async def _recent_events(master: MasterPort, subject: str, kind: str) -> list[EventRecord]:
    """``subject``'s events of ``kind``, oldest first, at most EVENTS_READ_MAX of them (the oldest dropped)."""
    found: list[EventRecord] = []
    after = 0
    while True:
        page = await master.events_after(subject=subject, kind_prefix=kind, after_seq=after, limit=EVENTS_PAGE)
        found.extend(e for e in page if e.kind == kind)
        if len(page) < EVENTS_PAGE:
            break
        after = page[-1].seq
        if len(found) > EVENTS_READ_MAX:
            found = found[-EVENTS_READ_MAX:]
    return found


def _price_change(event: EventRecord) -> PriceChange:
    data = event.data

    def micro(name: str) -> int | None:
        value = data.get(name)
        return int(value) if isinstance(value, int) else None

    return PriceChange(
        at=event.ts,
        agent_id=str(data.get("agent_id", "")),
        on_demand=micro("on_demand"),
        min_bid=micro("min_bid"),
        reserved=micro("reserved"),
    )


async def offer_detail(master: MasterPort, market: Market, offer_id: str, currency: str) -> OfferDetail:
    """The offer of host ``offer_id`` in detail; NotFound (saying why) when the host offers nothing now."""
    offer = market.offers.offer(offer_id)
    agent = master.registry.get(offer_id)
    gpus = [gpu_facts(gpu, master.offered(gpu)) for gpu in sorted(master.gpus(offer_id), key=lambda g: g.index)]
    changes = [_price_change(e) for e in await _recent_events(master, offer_id, PRICE_CHANGED)]
    changes += [
        _price_change(e)
        for e in await _recent_events(master, agent.provider, PRICE_CHANGED)
        if not e.data.get("agent_id")  # the provider's default, not another of its hosts
    ]
    transitions = [
        Transition(e.ts, str(e.data.get("old", "")), str(e.data.get("new", "")))
        for e in await _recent_events(master, offer_id, TRANSITION)
    ]
    spans = state_spans(transitions, state_now=agent.state, now=time.time(), window_s=AVAILABILITY_WINDOW_S)
    return OfferDetail(
        offer=offer,
        host=agent.host,
        gpus=gpus,
        price=market.prices.price(agent.provider, agent.id),
        prices=price_points(changes)[-PRICE_POINTS_SHOWN:],
        spans=spans,
        available_share=available_share(spans),
        window_s=AVAILABILITY_WINDOW_S,
        currency=currency,
    )
