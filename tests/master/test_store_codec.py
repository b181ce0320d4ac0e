"""The store's codec refuses NaN and infinities wherever a record holds them (master/store/codec.py), whether its
MessagePack search clears it or the field-by-field check decides."""

from __future__ import annotations

import json
import math

import pytest

from master.records import EventRecord, GpuRecord
from master.store.codec import surely_finite, to_document, to_json
from master.store.errors import UnstorableRecord
from tests.master.linked import gpus

# An integer whose MessagePack form (0xce, then 0xcb 0x7f 0xf0 0x00) holds the bytes a non-finite double starts with.
LOOKS_NON_FINITE = 0xCB7FF000


def event(**data: object) -> EventRecord:
    return EventRecord(ts=1_700_000_000.0, kind="gpu.transition", subject="GPU-1", data=data)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_an_event_holding_a_non_finite_float_deep_in_its_data_is_refused_naming_where(bad: float) -> None:
    rec = event(reason="hello", figures=[{"ok": 1.5}, {"watts": bad}])
    assert not surely_finite(rec)
    for encode in (to_json, to_document):
        with pytest.raises(UnstorableRecord, match=r"data\.figures\[1\]\.watts"):
            encode("events", "e-1", rec)


def test_an_event_whose_bytes_only_look_non_finite_is_stored() -> None:
    rec = event(count=LOOKS_NON_FINITE, name="\x7f")
    assert not surely_finite(rec)  # the search cannot tell: the field-by-field check decides, and finds nothing
    assert json.loads(to_json("events", "e-1", rec))["data"]["count"] == LOOKS_NON_FINITE
    assert to_document("events", "e-1", rec)["data"]["count"] == LOOKS_NON_FINITE


def test_a_clean_event_is_cleared_by_the_search_and_stored() -> None:
    rec = event(reason="hello", figures=[{"ok": 1.5, "big": 1e308, "tiny": -5e-324}], state="available")
    assert surely_finite(rec)
    assert json.loads(to_json("events", "e-1", rec))["data"]["figures"][0]["big"] == 1e308


def test_a_record_msgpack_cannot_encode_is_checked_field_by_field() -> None:
    huge = event(count=2**70)  # beyond MessagePack's 64-bit integers
    assert not surely_finite(huge)
    assert json.loads(to_json("events", "e-1", huge))["data"]["count"] == 2**70
    with pytest.raises(UnstorableRecord, match="data.watts"):
        to_json("events", "e-1", event(count=2**70, watts=math.nan))


def test_a_gpu_record_with_an_infinity_is_refused() -> None:
    info = gpus(1)[0]
    rec = GpuRecord(uuid="GPU-1", agent_id="agt-1", index=0, model="h100", info=info, state="available", updated_at=math.inf)
    with pytest.raises(UnstorableRecord, match="updated_at"):
        to_json("gpus", "GPU-1", rec)
