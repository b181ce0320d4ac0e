"""Host facts: read from this very machine, and parsed from the kernel's and the OS's own files."""

from __future__ import annotations

import os
import platform
import shutil
import socket

from agent.host import collect_host_info, cpu_model_from, mem_total_mib_from, os_pretty_name_from


def test_this_host_reports_plausible_facts(tmp_path):
    host = collect_host_info(tmp_path)

    assert host.hostname == socket.gethostname()
    assert host.cpu_model.strip()
    cores = os.cpu_count()
    assert cores is not None and host.cpu_cores == cores >= 1
    assert 256 <= host.ram_mib <= 64 * 1024 * 1024
    assert 0 < host.disk_free_gib <= host.disk_total_gib
    assert host.os.strip() and host.kernel == platform.release()
    assert (host.bandwidth_mbps_down, host.bandwidth_mbps_up, host.latency_ms) == (None, None, None)


def test_disk_figures_are_of_the_disk_holding_the_state_dir_even_before_it_exists(tmp_path):
    host = collect_host_info(tmp_path / "not" / "yet" / "created")

    assert host.disk_total_gib == round(shutil.disk_usage(tmp_path).total / 1024**3, 1)


def test_cpu_model_comes_from_model_name_on_x86_and_model_on_arm():
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd40\n\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"

    assert cpu_model_from(x86) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model_from(arm) == "Raspberry Pi 4 Model B Rev 1.4"
    assert cpu_model_from("") == ""


def test_memory_total_is_read_in_mib_from_meminfo():
    assert mem_total_mib_from("MemTotal:       263882012 kB\nMemFree:  1 kB\n") == 257697
    assert mem_total_mib_from("") == 0


def test_os_name_is_the_unquoted_pretty_name():
    release = 'NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'

    assert os_pretty_name_from(release) == "Debian GNU/Linux 12 (bookworm)"
    assert os_pretty_name_from("PRETTY_NAME=Alpine\n") == "Alpine"
    assert os_pretty_name_from("ID=debian\n") == ""
