"""Issue 38, point 4: the agent is shaped like the Master. Its sans-I/O core (agent/session.py ``MasterSession``) has
one rule, one ``case``, for each kind of frame the Master sends; its shell (agent/daemon.py ``Agent``) carries out
each action of the core's closed set with one ``case``; and the Master's side (master/agent_channel.py) takes each
agent frame it handles after the hello with one ``case``. A frame kind or an action added without its case fails here
(docs/architecture.md, "Where to add")."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from agent.session import Action
from common.wire import AgentFrame, Hello, MasterFrame

ROOT = Path(__file__).resolve().parent.parent


def matched_classes(path: str, cls: str, method: str) -> set[str]:
    """The class names the ``case`` patterns of ``cls.method``'s ``match`` statements name, alternatives included."""
    tree = ast.parse((ROOT / path).read_text(), path)
    (owner,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls]
    (function,) = [
        node for node in owner.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == method
    ]
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.MatchClass):
            names.add(node.cls.id if isinstance(node.cls, ast.Name) else ast.unparse(node.cls))
    return names


def names(union: object) -> set[str]:
    return {member.__name__ for member in get_args(union)}


def test_the_agents_core_has_a_case_for_every_frame_the_master_sends() -> None:
    missing = names(MasterFrame) - matched_classes("agent/session.py", "MasterSession", "receive")
    assert missing == set(), f"MasterSession.receive has no case for {sorted(missing)}"


def test_the_agents_shell_carries_out_every_action_of_the_core_with_one_case() -> None:
    missing = names(Action) - matched_classes("agent/daemon.py", "Agent", "_carry_out")
    assert missing == set(), f"Agent._carry_out has no case for {sorted(missing)}"


def test_the_masters_channel_has_a_case_for_every_agent_frame_after_the_hello() -> None:
    missing = names(AgentFrame) - {Hello.__name__} - matched_classes("master/agent_channel.py", "AgentChannel", "_take")
    assert missing == set(), f"the Master's channel has no case for {sorted(missing)}"


def test_a_missing_case_is_found(tmp_path: Path) -> None:
    shell = tmp_path / "shell.py"
    shell.write_text(
        "class Shell:\n"
        "    async def carry(self, action):\n"
        "        match action:\n"
        "            case Nothing() | SendHello():\n"
        "                pass\n"
        "            case RunCommand(command):\n"
        "                pass\n"
    )
    assert matched_classes(str(shell), "Shell", "carry") == {"Nothing", "SendHello", "RunCommand"}


IO = ("asyncio", "time", "socket", "ssl", "websockets", "aiohttp", "sqlite3", "pymongo", "threading", "os")


def imported(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text(), path)
    found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return found | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def test_both_sessions_are_pure_no_socket_no_clock_no_task() -> None:
    """The core decides and the shell does: agent/session.py and master/session.py import no I/O (the shell hands them
    the message, and the Master's the time)."""
    for path in ("agent/session.py", "master/session.py"):
        doing = sorted(m for m in imported(path) if any(m == io or m.startswith(io + ".") for io in IO))
        assert doing == [], f"{path} imports {doing}"
