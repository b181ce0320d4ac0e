"""The GPU self-test: before a host is offered, each GPU is shown to reach a container of the host's runtime.

A runtime that can test offers ``async def gpu_selftest(gpus: Sequence[GpuInfo]) -> list[GpuReach]`` (the
``GpuSelfTest`` protocol): one ``GpuReach`` per GPU, ``reachable`` or not, with what was seen (``detail``) and, when
not, what the provider can do (``fix``). It must not raise: a runtime error is an unreachable GPU with its reason.
The agent sends the result in its hello (``Inventory.gpu_reach``); the Master offers no GPU found unreachable and
shows why in the host's view (docs/onboarding.md).

``reach_in_containers`` is the test for runtimes that run containers: per GPU, a short container given that GPU alone
runs a probe command that prints the GPU UUIDs it sees (``nvidia-smi`` on real GPUs, inside the container, through the
engine's NVIDIA toolkit or CDI device; ``$CUDA_VISIBLE_DEVICES`` for the agent's simulated GPUs); the GPU reaches the
container when its UUID is printed. The container goes through the runtime's own ``create``, so a runtime that drops
or refuses a GPU request fails the test exactly as it would fail a renter's rental.

A runtime without ``gpu_selftest`` (the fleet simulator's) reports no result: its
GPUs are untested, offered as before, and the host's view says "not tested".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agent.runtime.base import ContainerRuntime
from common.containers import ContainerSpec
from common.errors import RuntimeFailure
from common.inventory import GpuInfo, GpuReach

SELFTEST_LABEL = "io.idlegrid.selftest"  # on the test's containers (no command id: the agent's lists skip them)
SELFTEST_POLL_S = 0.2  # how often the test looks whether its container has ended
DETAIL_CHARS = 400  # of a probe's output or an error, kept in ``detail`` (GpuReach bounds it at 512)


@runtime_checkable
class GpuSelfTest(Protocol):
    async def gpu_selftest(self, gpus: Sequence[GpuInfo]) -> list[GpuReach]: ...


async def gpu_selftest(runtime: ContainerRuntime, gpus: Sequence[GpuInfo]) -> list[GpuReach]:
    """The runtime's self-test of ``gpus``; none for a runtime without one (its GPUs are then untested, and offered)."""
    if not gpus or not isinstance(runtime, GpuSelfTest):
        return []
    return await runtime.gpu_selftest(gpus)


async def reach_in_containers(
    runtime: ContainerRuntime,
    gpus: Sequence[GpuInfo],
    *,
    image: str,
    command: Sequence[str],
    timeout_s: float,
    fix: str,
) -> list[GpuReach]:
    """For each GPU in turn, run ``command`` in ``image`` with that GPU alone; reachable when its UUID is printed.
    ``fix``: what to tell the provider when a GPU does not reach its container."""
    results = []
    for gpu in gpus:
        name = f"idlegrid-selftest-{gpu.index}"
        spec = ContainerSpec(name=name, image=image, command=list(command), gpus=[gpu.uuid])
        try:
            seen = await asyncio.wait_for(_probe(runtime, spec), timeout_s)
        except RuntimeFailure as exc:
            results.append(GpuReach(uuid=gpu.uuid, reachable=False, detail=_cut(str(exc)), fix=fix))
        except TimeoutError:
            detail = f"the self-test container did not end within {timeout_s:g} s"
            results.append(GpuReach(uuid=gpu.uuid, reachable=False, detail=detail, fix=fix))
        else:
            if gpu.uuid in seen:
                results.append(GpuReach(uuid=gpu.uuid, reachable=True, detail=f"seen in a {runtime.name} container"))
            else:
                detail = f"a {runtime.name} container given this GPU saw: {_cut(seen.strip()) or 'no GPU'}"
                results.append(GpuReach(uuid=gpu.uuid, reachable=False, detail=detail, fix=fix))
        finally:
            with contextlib.suppress(RuntimeFailure):
                await runtime.delete(name, timeout_s=0)
    return results


async def _probe(runtime: ContainerRuntime, spec: ContainerSpec) -> str:
    """Run ``spec`` to its end; what it printed (both streams)."""
    with contextlib.suppress(RuntimeFailure):
        await runtime.delete(spec.name, timeout_s=0)  # one left over by an agent that died mid-test
    info = await runtime.create(spec, labels={SELFTEST_LABEL: str(int(time.time()))})
    while info.state not in ("exited", "dead"):
        await asyncio.sleep(SELFTEST_POLL_S)
        found = await runtime.inspect(spec.name)
        if found is None:
            raise RuntimeFailure(f"the self-test container {spec.name!r} vanished before it ended")
        info = found
    output = b"".join([chunk async for _, chunk in runtime.logs(spec.name, tail=-1, follow=False)])
    text = output.decode("utf-8", "replace")
    if info.exit_code not in (0, None):
        raise RuntimeFailure(f"the self-test command exited with code {info.exit_code}: {_cut(text.strip()) or 'no output'}")
    return text


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"
