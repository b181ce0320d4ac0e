"""A renter's image registry reaches only what the egress rule allows (common/egress.py), checked by the agent's pull
path before it asks the engine to pull: a registry on the host's loopback, written in any form or behind a name that
resolves there, is refused as the renter's fault, and the counting listener standing in for it sees no connection
(neither from the agent nor from Podman). Names are resolved by a resolver the test gives, never by real DNS.

The engine resolves the registry's name again when it pulls, in its own process: a DNS answer that changes between
the agent's check and Podman's pull is outside what this check can stop (docs/images.md says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.runtime.docker import DockerRuntime
from agent.runtime.images import ImageLimits
from common.containers import ContainerSpec
from common.egress import EgressRule
from common.errors import EgressRefused, RuntimeFailure, is_renter_fault
from tests.support.egress import resolving_to_loopback
from tests.support.podman import PodmanService

pytestmark = pytest.mark.podman


def host(podman: PodmanService, tmp_path: Path, rule: EgressRule) -> DockerRuntime:
    return DockerRuntime(podman.socket_path, images=ImageLimits(egress=rule), image_state=tmp_path / "images.json")


@pytest.mark.parametrize("registry", ["127.0.0.1:{port}", "localhost:{port}", "2130706433:{port}", "0x7f.1:{port}"])
async def test_a_registry_on_the_hosts_loopback_is_refused_before_any_pull(podman, listener, tmp_path, registry):
    image = f"{registry.format(port=listener.port)}/tools/busy:1"
    runtime = host(podman, tmp_path, EgressRule())
    try:
        with pytest.raises(EgressRefused, match="public addresses") as refused:
            await runtime.ensure_image(ContainerSpec(name="pulled", image=image, command=["true"]))
    finally:
        await runtime.close()
    assert is_renter_fault(refused.value.code) and "egress_allow" in str(refused.value)
    assert listener.connections() == 0


async def test_a_registry_name_that_resolves_to_loopback_is_refused_before_any_pull(podman, listener, tmp_path):
    runtime = host(podman, tmp_path, EgressRule(resolver=resolving_to_loopback))
    image = f"registry.example:{listener.port}/tools/busy:1"
    try:
        with pytest.raises(EgressRefused, match=r"registry.example resolves to 127.0.0.1: a loopback address"):
            await runtime.ensure_image(ContainerSpec(name="pulled", image=image, command=["true"]))
    finally:
        await runtime.close()
    assert listener.connections() == 0


async def test_a_registry_the_provider_allows_by_name_is_pulled_from(podman, listener, tmp_path):
    # The listener answers no registry protocol: the engine connects, then the pull runs out of the host's time.
    rule = EgressRule.allowing([f"127.0.0.1:{listener.port}"])
    runtime = DockerRuntime(
        podman.socket_path, images=ImageLimits(egress=rule, pull_timeout_s=5.0), image_state=tmp_path / "images.json"
    )
    image = f"127.0.0.1:{listener.port}/tools/busy:1"
    try:
        with pytest.raises(RuntimeFailure) as failed:
            await runtime.ensure_image(ContainerSpec(name="pulled", image=image, command=["true"]))
    finally:
        await runtime.close()
    assert not isinstance(failed.value, EgressRefused)
    assert listener.connections() >= 1  # the pull went to the registry the provider allows
