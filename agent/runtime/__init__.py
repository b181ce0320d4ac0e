"""Container runtimes the agent can drive: a Docker-API engine (the default), or sandboxed host processes."""

from __future__ import annotations

from typing import Any

from agent.runtime.base import ContainerRuntime
from agent.runtime.docker import DockerRuntime
from agent.runtime.process import ProcessRuntime
from agent.runtime.simulated import SimulatedRuntime
from common.errors import ConfigError

RUNTIMES: dict[str, type] = {"docker": DockerRuntime, "process": ProcessRuntime, "simulated": SimulatedRuntime}


def open_runtime(kind: str, **options: Any) -> ContainerRuntime:
    """``docker``: options ``socket`` (default /var/run/docker.sock), ``images`` (pull limits), ``timeout_s``, ``capabilities``,
    ``simulated_gpus`` (no device requests: the agent's GPUs are simulated).
    ``process``: options ``state_dir`` (required), where the container records live; ``user`` (default ``nobody``,
    "" for the agent's own) and ``work_root`` (default ``<state_dir>-work``), see agent/runtime/process.py.
    ``simulated``: options ``latency_s``, ``jitter_s``, ``failure_rate``, ``seed``; runs nothing (fleet simulator, tests)."""
    runtime = RUNTIMES.get(kind)
    if runtime is None:
        raise ConfigError(f"unknown container runtime {kind!r}: choose one of {', '.join(RUNTIMES)}")
    try:
        return runtime(**options)
    except TypeError as exc:  # a misspelt or missing option in the agent's settings
        raise ConfigError(f"bad options for the {kind} runtime: {exc}") from exc


__all__ = ["ContainerRuntime", "DockerRuntime", "ProcessRuntime", "RUNTIMES", "SimulatedRuntime", "open_runtime"]
