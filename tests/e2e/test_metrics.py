"""Every daemon's /metrics is what Prometheus can take: a real Master and a real relay, as processes, after an
agent enrolled through the relay and has been sending frames, scraped and passed through ``promtool check
metrics`` (format and lint), with the series a person running them looks at present; and a real Prometheus
scrapes both (the relay over TLS, trusting the platform CA)."""

from __future__ import annotations

import urllib.request

import pytest

from tests.support.grid import Grid, free_port, wait_for
from tests.support.prometheus import PrometheusServer, ScrapeJob, check_metrics, names, sample

pytestmark = pytest.mark.e2e

# The Master's series; its metrics grow as the Master does: add them here.
LOOP_SERIES = ("idlegrid_event_loop_lag_seconds_bucket", "idlegrid_gc_pause_seconds_total", "idlegrid_gc_longest_pause_seconds")
MASTER_SERIES = ("idlegrid_agents", "idlegrid_gpus", "idlegrid_commands_open", "idlegrid_relays_connected", *LOOP_SERIES)
RELAY_SERIES = (
    "idlegrid_access_agents_connected",
    "idlegrid_access_frames_in_total",
    "idlegrid_access_frames_out_total",
    "idlegrid_access_connections_opened_total",
    "idlegrid_access_enrollments_total",
    "idlegrid_access_buffered_frames",
    "idlegrid_access_master_link_up",
    "idlegrid_access_master_link_dials_total",
    "idlegrid_access_speedtest_bytes_total",
    "idlegrid_access_http_requests_total",
    "idlegrid_access_http_request_duration_seconds_bucket",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    *LOOP_SERIES,
)


def master_metrics(grid: Grid) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{grid.api_port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.fixture
def busy_grid(grid: Grid) -> Grid:
    """The grid with one agent enrolled through relay-1 and ready, its heartbeats flowing through the relay."""
    grid.run_agent("metrics-agent")
    relay = grid.relays["relay-1"]
    wait_for(
        lambda: (sample(grid.relay_metrics(relay), "idlegrid_access_frames_in_total", type="heartbeat") or 0) >= 2,
        20,
        "heartbeats through the relay",
    )
    return grid


def test_a_relays_metrics_pass_promtool_and_carry_the_key_series(busy_grid):
    text = busy_grid.relay_metrics(busy_grid.relays["relay-1"])

    check = check_metrics(text)
    assert check.clean, check.findings
    assert set(RELAY_SERIES) <= names(text), set(RELAY_SERIES) - names(text)
    assert sample(text, "idlegrid_access_agents_connected") == 1
    assert sample(text, "idlegrid_access_master_link_up") == 1
    assert sample(text, "idlegrid_access_enrollments_total", outcome="ok") == 1
    assert sample(text, "idlegrid_access_frames_in_total", type="hello") == 1
    assert sample(text, "idlegrid_access_frames_out_total", type="welcome") == 1
    assert (sample(text, "idlegrid_event_loop_lag_seconds_count", daemon="relay") or 0) > 0  # its loop is watched


def test_the_masters_metrics_pass_promtool_and_carry_the_key_series(busy_grid):
    text = master_metrics(busy_grid)

    check = check_metrics(text)
    assert check.clean, check.findings
    assert set(MASTER_SERIES) <= names(text), set(MASTER_SERIES) - names(text)
    assert sample(text, "idlegrid_agents", state="ready") == 1
    assert sample(text, "idlegrid_relays_connected") == 1
    assert (sample(text, "idlegrid_event_loop_lag_seconds_count", daemon="master") or 0) > 0


def test_a_real_prometheus_scrapes_the_master_and_the_relay_over_tls(busy_grid, tmp_path):
    relay = busy_grid.relays["relay-1"]
    server = PrometheusServer(
        tmp_path / "prometheus",
        [
            ScrapeJob("master", (f"127.0.0.1:{busy_grid.api_port}",)),
            ScrapeJob("access", (f"127.0.0.1:{relay.http_port}",), scheme="https", ca_file=busy_grid.authority.ca_file),
        ],
        port=free_port(),
    )
    server.start()
    try:
        up = wait_for(
            lambda: (t := server.targets()) and all(target["health"] == "up" for target in t) and t,
            30,
            "both targets scraped",
        )
        assert {target["labels"]["job"] for target in up} == {"master", "access"}
        assert [value for _, value in server.query("idlegrid_access_agents_connected")] == [1.0]
        assert [value for _, value in server.query("idlegrid_relays_connected")] == [1.0]
    finally:
        server.stop()
