"""The host's own telemetry, read from /proc: against files laid out as Linux writes them (a directory the test
fills), and against this machine's real /proc."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from agent.host_sample import HostSampler
from common.inventory import GpuSample, HostSample
from common.wire import Telemetry

MEMINFO = "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   16384000 kB\nBuffers:   1 kB\n"
NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 9999999     100    0    0    0     0          0         0  9999999     100    0    0    0     0       0          0
  eth0: 1000        10    0    0    0     0          0         0     200       2    0    0    0     0       0          0
  eth1:  500         5    0    0    0     0          0         0      50       1    0    0    0     0       0          0
"""


def proc(tmp_path: Path, *, user: int, idle: int) -> Path:
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True, exist_ok=True)
    # user nice system idle iowait irq softirq steal
    (root / "stat").write_text(f"cpu  {user} 0 100 {idle} 50 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    (root / "loadavg").write_text("1.25 0.80 0.50 2/345 6789\n")
    (root / "meminfo").write_text(MEMINFO)
    (root / "net" / "dev").write_text(NET_DEV)
    return root


def test_a_sample_reads_memory_load_disk_and_network_without_loopback(tmp_path):
    sampler = HostSampler(tmp_path, proc=proc(tmp_path, user=1000, idle=8000))
    first = sampler.sample(100.0)
    assert first.cpu_pct is None  # one reading of /proc/stat says nothing about a share of time
    assert (first.ram_total_mib, first.ram_used_mib) == (32_000, 16_000)
    assert first.load_1m == 1.25
    assert (first.net_rx_bytes, first.net_tx_bytes) == (1500, 250)
    assert first.disk_free_gib is not None and first.disk_used_gib is not None


def test_cpu_is_the_busy_share_of_the_jiffies_between_two_samples(tmp_path):
    sampler = HostSampler(tmp_path, proc=proc(tmp_path, user=1000, idle=8000))
    sampler.sample(100.0)
    proc(tmp_path, user=1300, idle=8100)  # 300 busy, 100 idle since: 75% busy
    assert sampler.sample(110.0).cpu_pct == 75.0


def test_without_proc_every_reading_is_none_and_nothing_raises(tmp_path):
    sample = HostSampler(tmp_path / "no-disk", proc=tmp_path / "no-proc").sample(1.0)
    assert sample == HostSample(ts=1.0)


def test_this_machines_proc_gives_sane_figures(tmp_path):
    sampler = HostSampler(tmp_path)
    sampler.sample(time.time())
    time.sleep(0.05)
    sample = sampler.sample(time.time())
    assert sample.ram_total_mib and 0 < (sample.ram_used_mib or 0) <= sample.ram_total_mib
    assert sample.cpu_pct is None or 0 <= sample.cpu_pct <= 100
    assert sample.net_rx_bytes is not None and sample.net_rx_bytes >= 0


def test_a_telemetry_frame_of_an_older_agent_without_a_host_sample_still_decodes():
    older = msgspec.json.encode({"type": "telemetry", "ts": 1.0, "samples": [{"uuid": "GPU-a", "ts": 1.0}]})
    frame = msgspec.json.decode(older, type=Telemetry)
    assert frame.host is None and frame.samples == [GpuSample(uuid="GPU-a", ts=1.0)]
