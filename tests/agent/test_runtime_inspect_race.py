"""An inspect that races a container's exit: Podman answers 500 "read /proc/N/cgroup: no such process" (seen in CI
on a stopped container). The engine's answers are given here, since the race cannot be produced at will with a real
Podman (its real answers are covered by tests/agent/test_runtime_docker.py)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.runtime import docker
from agent.runtime.docker import DockerRuntime
from common.errors import RuntimeFailure

RACE = (500, {"message": "read /proc/4242/cgroup: no such process"})
EXITED = (200, {"Name": "/job", "Id": "c0ffee", "State": {"Status": "exited", "ExitCode": 0}, "Config": {"Labels": {}}})


def scripted(runtime: DockerRuntime, answers: list[tuple[int, Any]]) -> list[str]:
    """The runtime's engine answers ``answers`` in turn; returns the paths it was asked."""
    asked: list[str] = []

    async def call(method: str, path: str, **_: Any) -> tuple[int, Any]:
        asked.append(f"{method} {path}")
        return answers.pop(0)

    runtime._call = call  # type: ignore[method-assign]
    return asked


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, tmp_path) -> DockerRuntime:
    monkeypatch.setattr(docker, "INSPECT_RACE_PAUSES_S", (0.0, 0.0, 0.0))
    return DockerRuntime(tmp_path / "absent.sock")


async def test_an_inspect_that_raced_the_exit_is_asked_again_and_describes_the_exited_container(runtime):
    asked = scripted(runtime, [RACE, RACE, EXITED])
    raw = await runtime._inspect_raw("job")
    assert raw is not None and raw["State"]["Status"] == "exited"
    assert asked == ["GET /containers/job/json"] * 3


async def test_a_race_that_does_not_pass_is_a_failure_naming_the_engines_answer(runtime):
    asked = scripted(runtime, [RACE] * 4)
    with pytest.raises(RuntimeFailure, match="no such process"):
        await runtime._inspect_raw("job")
    assert len(asked) == 4  # the first try and one for each pause, no more


async def test_other_engine_errors_are_not_asked_again(runtime):
    asked = scripted(runtime, [(500, {"message": "database is locked"})])
    with pytest.raises(RuntimeFailure, match="database is locked"):
        await runtime._inspect_raw("job")
    assert len(asked) == 1
