"""Faults injected into simulated GPUs through the agent's faults file: what the samples and reports then say."""

from __future__ import annotations

import json
import logging
import os

from agent.fault_injection import FAULTS_FILE, FaultInjection
from agent.simulate import SimulatedCollector
from common.wire import AgentEventKind


def collector(tmp_path) -> tuple[SimulatedCollector, list[str]]:
    gpus = SimulatedCollector("h100:3", seed=7, faults=FaultInjection(tmp_path / FAULTS_FILE))
    return gpus, [g.uuid for g in gpus.inventory()]


def inject(tmp_path, faults: dict) -> None:
    path = tmp_path / FAULTS_FILE
    path.write_text(json.dumps(faults))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a rewrite within one mtime tick still counts


def test_without_a_faults_file_the_cards_are_healthy(tmp_path):
    gpus, _ = collector(tmp_path)
    samples = gpus.sample()
    assert all(s.ecc_uncorrected == 0 and s.temperature_c is not None and s.temperature_c <= 90 for s in samples)
    assert gpus.reports() == []


def test_injected_temperature_and_ecc_show_in_every_sample_until_removed(tmp_path):
    gpus, (first, second, third) = collector(tmp_path)
    inject(tmp_path, {first: {"temperature_c": 97}, second: {"ecc_uncorrected": 3}})
    for _ in range(2):
        by_uuid = {s.uuid: s for s in gpus.sample()}
        assert by_uuid[first].temperature_c == 97 and by_uuid[second].ecc_uncorrected == 3
        cool = by_uuid[third].temperature_c
        assert cool is not None and cool <= 90 and by_uuid[third].ecc_uncorrected == 0
    (tmp_path / FAULTS_FILE).unlink()
    assert all(s.temperature_c is not None and s.temperature_c <= 90 and s.ecc_uncorrected == 0 for s in gpus.sample())


def test_an_injected_xid_is_reported_once_and_again_only_when_it_changes(tmp_path):
    gpus, (first, *_) = collector(tmp_path)
    inject(tmp_path, {first: {"xid": 79}})
    [report] = gpus.reports()
    assert (report.kind, report.gpu_uuid, report.code) == (AgentEventKind.GPU_XID, first, 79)
    assert gpus.reports() == []
    inject(tmp_path, {first: {"xid": 48}})
    assert [r.code for r in gpus.reports()] == [48]


def test_an_overheated_card_reports_a_thermal_slowdown_and_its_xids_are_counted_in_its_samples(tmp_path):
    gpus, (first, second, _) = collector(tmp_path)
    inject(tmp_path, {first: {"temperature_c": 97, "xid": 79}})
    gpus.reports()
    inject(tmp_path, {first: {"temperature_c": 97, "xid": 48}})
    gpus.reports()
    by_uuid = {s.uuid: s for s in gpus.sample()}
    assert "sw_thermal" in by_uuid[first].throttle_reasons and by_uuid[first].xid_count == 2
    assert "sw_thermal" not in by_uuid[second].throttle_reasons and by_uuid[second].xid_count == 0
    assert by_uuid[second].clock_mem_mhz is not None


def test_a_faults_file_that_does_not_parse_is_logged_and_the_previous_faults_stay(tmp_path, caplog):
    gpus, (first, *_) = collector(tmp_path)
    inject(tmp_path, {first: {"temperature_c": 97}})
    gpus.sample()
    inject(tmp_path, {first: {"temprature_c": 20}})  # a typo: refused, not silently healthy
    with caplog.at_level(logging.WARNING, logger="agent.fault_injection"):
        assert {s.uuid: s for s in gpus.sample()}[first].temperature_c == 97
    assert "temprature_c" in caplog.text and FAULTS_FILE in caplog.text
