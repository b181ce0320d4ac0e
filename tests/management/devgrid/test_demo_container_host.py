"""The demo's container host without Podman running: the demo's own template as the Master reads it, and a machine
without podman, where the demo comes up without a container host and its banner says why and what to install."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from management.devgrid.demo import DEMO_TEMPLATE, TEMPLATES_DIR, Demo
from management.devgrid.localgrid import RelayInfo, free_port
from management.devgrid.podman_host import DEMO, DEMO_IMAGE, DEMO_PORT
from management.launch.templates import TemplateCatalog


def test_the_demos_template_runs_its_local_image_and_links_the_port_its_web_server_listens_on():
    template = TemplateCatalog.load(TEMPLATES_DIR).get(DEMO_TEMPLATE)

    assert (template.image, template.source) == (DEMO_IMAGE, "operator")
    assert [(p.port, p.kind) for p in template.ports] == [(DEMO_PORT, "http")]
    assert template.command == []  # the image's own CMD: its web server
    assert f'"-p", "{DEMO_PORT}"' in next(change for change in DEMO.changes if change.startswith("CMD"))


def test_without_podman_the_demo_has_no_container_host_and_its_banner_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # a machine where podman and runc are not installed
    demo = Demo(tmp_path / "demo", api_port=free_port(), agents=1)
    relay = RelayInfo("relay-a", "eu-west", free_port(), free_port())

    with ThreadPoolExecutor(max_workers=1) as pool:
        enrolled = demo._enroll_container_host(pool.submit(demo._prepare_engine), relay)

    assert enrolled is False and not (tmp_path / "demo" / "agents").exists()  # nothing enrolled for it
    [line] = demo.container_host_lines()
    assert line.startswith("  container host:  none: Podman could not start here: podman, runc, slirp4netns are not installed")
    assert "apt-get install podman runc busybox-static slirp4netns" in line and "templates need one" in line
    assert "none runs here without a container host" in "\n".join(demo.template_lines("idlegrid"))


def test_a_container_host_gpu_its_self_test_still_fails_is_named_with_why_in_the_banner_not_silently_ready(
    tmp_path: Path,
) -> None:
    """No Podman runs here: the demo as its readiness wait leaves it when one GPU's self-test still failed by its
    deadline (what a loaded CI saw: runc failing that GPU's container every time)."""
    demo = Demo(tmp_path / "demo", api_port=free_port(), agents=2)
    demo.container_host_id = "agent-podman"
    why = "the engine failed for a reason that usually passes, 3 tries in a row: ... can't get final child's PID from pipe"
    demo.unoffered = [("GPU-sim-l4-1", why)]

    assert demo.up_line().startswith("idlegrid demo is up: 2 simulated agents and 1 container host ready (1 GPU of it not")
    [_, _, named] = demo.container_host_lines()
    assert named.startswith(f"    NOT OFFERED:   GPU GPU-sim-l4-1, its self-test failed: {why}")
    assert named.endswith("podman-host.log)")

    demo.unoffered = []
    assert "not offered" not in demo.up_line() and len(demo.container_host_lines()) == 2
