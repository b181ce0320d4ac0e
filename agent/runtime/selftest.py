"""The GPU self-test: before a host is offered, each GPU is shown to reach a container of the host's runtime.

A runtime that can test offers ``async def gpu_selftest(gpus: Sequence[GpuInfo]) -> list[GpuReach]`` (the
``GpuSelfTest`` protocol): one ``GpuReach`` per GPU, ``reachable`` or not, with what was seen (``detail``) and, when
not, what the provider can do (``fix``). It must not raise: a runtime error is an unreachable GPU with its reason.
The agent sends the result in its hello (``Inventory.gpu_reach``); the Master offers no GPU found unreachable and
shows why in the host's view (docs/onboarding.md).

``reach_in_containers`` is the test for runtimes that run containers: per GPU, a short container given that GPU alone
runs its vendor's probe (``Probe``), which prints what it sees; the GPU reaches the container when the probe prints
what it expects of that GPU:

- NVIDIA: ``nvidia-smi`` inside the container (through the engine's NVIDIA toolkit or CDI device) prints the GPU's
  uuid;
- AMD: the container opens ``/dev/kfd`` and the render nodes it was given, as its own user with its own groups through
  the engine's device rules (what ROCm needs of a container, and where it most often fails: a missing device or
  group), and prints each render node it could open; where the image has ROCm's ``rocminfo``, that must list the
  card too. The GPU's render node (sysfs names it: agent/runtime/gpu_access.py) must be printed. The process
  runtime's AMD probe asks ``rocminfo`` (ROCm's, on the host) for the cards ``ROCR_VISIBLE_DEVICES`` shows, which
  must be that card's uuid alone;
- simulated GPUs (no device): the probe prints the variable that names them (``$CUDA_VISIBLE_DEVICES``,
  ``$ROCR_VISIBLE_DEVICES`` for AMD's). The container goes through the runtime's own ``create``, so a runtime that drops
or refuses a GPU request fails the test exactly as it would fail a renter's rental.

A runtime without ``gpu_selftest`` (the fleet simulator's) reports no result: its
GPUs are untested, offered as before, and the host's view says "not tested".

An engine under load fails now and then for reasons that pass (runc losing its child: "can't get final child's PID";
CNI's namespace file hidden for a moment: "unknown FS magic"). Such a failure says nothing of the GPU, so its container
is tried again at once, ``SelfTestRetry.tries`` times in all with a short backoff (``transient`` tells these errors
from the GPU's own answers: a probe that ran and did not see it, an image or device the host lacks). A GPU whose
test still failed for a reason that passes (``retest_later``: such an error every time, or a container too slow to
end) is tested again later by the agent (agent/daemon.py), a bounded number of times, and offered once it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent.runtime.base import ContainerRuntime
from common.containers import ContainerSpec
from common.errors import RuntimeFailure
from common.inventory import GpuInfo, GpuReach

SELFTEST_LABEL = "io.idlegrid.selftest"  # on the test's containers (no command id: the agent's lists skip them)
SELFTEST_POLL_S = 0.2  # how often the test looks whether its container has ended
DETAIL_CHARS = 400  # of a probe's output or an error, kept in ``detail`` (GpuReach bounds it at 512)
# What engines say when a container failed for a reason that passes (the engine's, under load), lowercased: runc's child
# lost before it reported its pid (two spellings over runc's versions), a namespace file another mount namespace hid from
# CNI for a moment, a resource briefly exhausted.
TRANSIENT_ENGINE_ERRORS = (
    "can't get final child's pid",
    "read init-p",
    "unknown fs magic",
    "resource temporarily unavailable",
    "connection reset by peer",
)
# How a failed GPU's detail starts when its failure passes (retest_later reads it back: the agent's own words).
TRANSIENT_DETAIL = "the engine failed for a reason that usually passes, {tries}: "
TIMED_OUT_DETAIL = "the self-test container did not end within "


@runtime_checkable
class GpuSelfTest(Protocol):
    async def gpu_selftest(self, gpus: Sequence[GpuInfo]) -> list[GpuReach]: ...


async def gpu_selftest(runtime: ContainerRuntime, gpus: Sequence[GpuInfo]) -> list[GpuReach]:
    """The runtime's self-test of ``gpus``; none for a runtime without one (its GPUs are then untested, and offered)."""
    if not gpus or not isinstance(runtime, GpuSelfTest):
        return []
    return await runtime.gpu_selftest(gpus)


def transient(error: str) -> bool:
    """Whether ``error``, what a self-test container's create or start failed with, is the engine's passing trouble
    (TRANSIENT_ENGINE_ERRORS), not an answer about the GPU or the host's setup."""
    lowered = error.lower()
    return any(words in lowered for words in TRANSIENT_ENGINE_ERRORS)


def retest_later(reach: GpuReach) -> bool:
    """Whether a GPU's self-test is worth running again later: it failed for a reason that passes (an engine error of
    TRANSIENT_ENGINE_ERRORS every time it was tried, or a container too slow to end), not for what the GPU is."""
    return not reach.reachable and reach.detail.startswith((TRANSIENT_DETAIL.split("{", 1)[0], TIMED_OUT_DETAIL))


@dataclass(frozen=True)
class SelfTestRetry:
    """How one GPU's self-test meets the engine's passing errors: ``tries`` in all, waiting ``backoff_s`` before the
    second and twice as long before each next one."""

    tries: int = 3
    backoff_s: float = 1.0

    def wait_before_next(self, tries_done: int, error: str) -> float | None:
        """After ``tries_done`` tries, the last failing with ``error``: seconds to wait before the next, or None when
        there is no next (the error is the GPU's answer, or no try is left)."""
        if tries_done >= self.tries or not transient(error):
            return None
        return self.backoff_s * 2 ** (tries_done - 1)


SELFTEST_RETRY = SelfTestRetry()  # the agent's: agent/config.py sets its tries


@dataclass(frozen=True)
class Probe:
    """What a self-test container given one GPU runs, what it prints when it sees that GPU (``expect``: the GPU's uuid
    for NVIDIA's probe, its render node for AMD's), and what to tell the provider when it does not (``fix``)."""

    command: tuple[str, ...]
    expect: str
    fix: str


async def reach_in_containers(
    runtime: ContainerRuntime,
    gpus: Sequence[GpuInfo],
    *,
    image: str,
    probe: Callable[[GpuInfo], Probe],
    timeout_s: float,
    retry: SelfTestRetry = SELFTEST_RETRY,
) -> list[GpuReach]:
    """For each GPU in turn, run its ``probe`` in ``image`` with that GPU alone; reachable when the probe prints what
    it expects. A container the engine failed for a passing reason is tried again as ``retry`` says."""
    results = []
    for gpu in gpus:
        # An NVIDIA and an AMD card may share an index (each vendor numbers its own).
        name = f"idlegrid-selftest-{gpu.index}" if gpu.vendor == "nvidia" else f"idlegrid-selftest-{gpu.vendor}-{gpu.index}"
        test = probe(gpu)
        spec = ContainerSpec(name=name, image=image, command=list(test.command), gpus=[gpu.uuid])
        tries = 0
        while True:
            tries += 1
            reach, error = await _try(runtime, gpu, spec, test, timeout_s)
            wait_s = retry.wait_before_next(tries, error) if error else None
            if wait_s is None:
                break
            await asyncio.sleep(wait_s)
        if error and transient(error):
            said = TRANSIENT_DETAIL.format(tries="once" if tries == 1 else f"{tries} tries in a row")
            reach = GpuReach(uuid=gpu.uuid, reachable=False, detail=_cut(said + error), fix=test.fix)
        results.append(reach)
    return results


async def _try(
    runtime: ContainerRuntime, gpu: GpuInfo, spec: ContainerSpec, test: Probe, timeout_s: float
) -> tuple[GpuReach, str]:
    """One run of ``test`` for ``gpu``: what it showed, and the engine's error when its container failed ("" when it
    ran, or did not end in time)."""
    try:
        seen = await asyncio.wait_for(_probe(runtime, spec), timeout_s)
    except RuntimeFailure as exc:
        return GpuReach(uuid=gpu.uuid, reachable=False, detail=_cut(str(exc)), fix=test.fix), str(exc)
    except TimeoutError:
        detail = f"{TIMED_OUT_DETAIL}{timeout_s:g} s"
        return GpuReach(uuid=gpu.uuid, reachable=False, detail=detail, fix=test.fix), ""
    finally:
        with contextlib.suppress(RuntimeFailure):
            await runtime.delete(spec.name, timeout_s=0)
    if test.expect and test.expect in seen:
        return GpuReach(uuid=gpu.uuid, reachable=True, detail=f"seen in a {runtime.name} container"), ""
    detail = f"a {runtime.name} container given this GPU saw: {_cut(seen.strip()) or 'no GPU'}"
    return GpuReach(uuid=gpu.uuid, reachable=False, detail=detail, fix=test.fix), ""


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
