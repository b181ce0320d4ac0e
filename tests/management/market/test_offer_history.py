"""An offer's history, pure: the prices a host charged over time (its own over its provider's default) and the share of
a window it spent offering (ready or busy); and the menus of what is offered."""

from __future__ import annotations

import pytest

from management.market.offer_history import (
    PriceChange,
    PricePoint,
    StateSpan,
    Transition,
    available_share,
    price_points,
    state_spans,
)
from management.market.offers import Offer, offer_choices


def change(at: float, agent_id: str, on_demand: int | None, min_bid: int | None = None, reserved: int | None = None):
    return PriceChange(at=at, agent_id=agent_id, on_demand=on_demand, min_bid=min_bid, reserved=reserved)


def test_a_hosts_own_price_outranks_its_providers_default_while_it_is_set():
    points = price_points(
        [
            change(10, "", 1_200_000, 400_000),
            change(20, "agt-1", 2_500_000, None, 2_000_000),
            change(30, "", 1_000_000),  # the default moved while the host had its own: the host charged the same
            change(40, "agt-1", None),  # cleared: back to the default in force
        ]
    )
    assert points == [
        PricePoint(10, 1_200_000, 400_000, 1_200_000, "provider"),
        PricePoint(20, 2_500_000, None, 2_000_000, "host"),
        PricePoint(40, 1_000_000, None, 1_000_000, "provider"),
    ]


def test_prices_are_taken_in_time_order_and_a_change_that_changes_nothing_makes_no_point():
    points = price_points([change(30, "", 1_000_000), change(10, "", 1_000_000), change(20, "", 1_000_000)])
    assert points == [PricePoint(10, 1_000_000, None, 1_000_000, "provider")]
    assert price_points([change(5, "agt-1", None)]) == []  # a clear with nothing to fall back to


def test_the_window_is_cut_at_each_transition_and_starts_no_earlier_than_the_first():
    transitions = [Transition(100, "enrolled", "ready"), Transition(160, "ready", "offline"), Transition(190, "offline", "ready")]
    spans = state_spans(transitions, state_now="ready", now=220, window_s=1000)
    assert spans == [StateSpan(100, 160, "ready"), StateSpan(160, 190, "offline"), StateSpan(190, 220, "ready")]
    assert available_share(spans) == pytest.approx(90 / 120)


def test_a_window_shorter_than_the_history_starts_in_the_state_the_next_transition_left():
    transitions = [
        Transition(0, "enrolled", "ready"),
        Transition(500, "ready", "maintenance"),
        Transition(900, "maintenance", "busy"),
    ]
    spans = state_spans(transitions, state_now="busy", now=1000, window_s=300)
    assert spans == [StateSpan(700, 900, "maintenance"), StateSpan(900, 1000, "busy")]
    assert available_share(spans) == pytest.approx(100 / 300)


def test_a_host_without_transitions_is_in_its_state_now_for_the_whole_window():
    assert state_spans([], state_now="offline", now=1000, window_s=100) == [StateSpan(900, 1000, "offline")]
    assert available_share([]) is None


def make_offer(host_id: str, *, model: str, tier: str, region: str) -> Offer:
    return Offer(
        id=host_id, host=host_id, provider="acme", region=region, model=model, num_gpus=1, num_gpus_on_demand=1,
        total_gpus=1, gpu_ram=24.0, tier=tier, compute_capability="8.9", cuda="12.4", price=1_000_000, min_bid=None,
        reserved_price=1_000_000, max_duration_s=None, reliability=1.0, inet_down=None, inet_up=None, cpu_cores=8.0,
        ram_gib=64.0, disk_gib=None, verified=False, interruptible=False, runtime="docker", nvlink=False, score=1.0,
    )  # fmt: skip


def test_the_menus_list_each_model_tier_and_region_once_sorted_without_empty_values():
    offers = [
        make_offer("a", model="l4", tier="inference", region="eu-west"),
        make_offer("b", model="h100-sxm", tier="", region="us-east"),
        make_offer("c", model="l4", tier="inference", region="eu-west"),
    ]
    choices = offer_choices(offers)
    assert (choices.models, choices.tiers, choices.regions) == (["h100-sxm", "l4"], ["inference"], ["eu-west", "us-east"])
