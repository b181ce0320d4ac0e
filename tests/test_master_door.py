"""The narrow door between management and the Master (docs/architecture.md, "The door to the Master").

``MasterPort`` hands out each Master part typed by a read-only view (master/views.py); writes are the port's
operations. mypy enforces it on every management module; these tests show that it does (a module reaching past a
view fails type checking) and count the reaches management makes past the port, which must be none."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from pathlib import Path

import master.port as port
import master.views as views
from master.port import MasterPort
from tests.support.typecheck import failing_lines

ROOT = Path(__file__).resolve().parent.parent
# Properties of the port that are values, not parts: settings management reads whole, and facts about the running
# Master (its role, when it started, its link's URL).
VALUES = {"config", "policy", "role", "started_at", "link_url"}
# The names management gives a MasterPort (``self._master``, ``self.master``, ``observer.master``); a function's own
# short name for one (``m = self._master``) counts too.
PORT_NAMES = {"master", "_master"}
# Where ``master`` names something else: a local grid's Master is the daemon process it runs, reached by its API.
OTHER_MASTERS = {"management/devgrid/localgrid.py"}


def _parts() -> dict[str, type]:
    """Each part ``MasterPort`` hands out -> the type its property is declared with (``None`` left out)."""
    found = {}
    for name, member in vars(MasterPort).items():
        if isinstance(member, property) and member.fget is not None and name not in VALUES:
            returned = typing.get_type_hints(member.fget, vars(port))["return"]
            if isinstance(returned, types.UnionType):
                (returned,) = [arg for arg in typing.get_args(returned) if arg is not type(None)]
            found[name] = returned
    return found


def _members(view: type) -> set[str]:
    return {name for name in vars(view) if not name.startswith("_")} | set(getattr(view, "__annotations__", {}))


def _port_members() -> set[str]:
    return {name for name, _ in inspect.getmembers(MasterPort) if not name.startswith("_")} | set(MasterPort.__annotations__)


def _chain(node: ast.expr) -> list[str]:
    """``self._master.registry.agents`` -> ["self", "_master", "registry", "agents"]; [] when it starts elsewhere."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _aliases(function: ast.AST) -> set[str]:
    """The names a function binds to the port: ``m = self._master``."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and (chain := _chain(node.value)) and chain[-1] in PORT_NAMES
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _reaches(scope: ast.AST, names: set[str], parts: dict[str, type], port_members: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(scope):
        if not isinstance(node, ast.Attribute):
            continue
        chain = _chain(node)
        for i, name in enumerate(chain[:-1]):
            if name not in names:
                continue
            member = chain[i + 1]
            if member not in port_members:
                found.add(f"line {node.lineno}: {name}.{member}")
            elif member in parts and i + 2 < len(chain) and chain[i + 2] not in _members(parts[member]):
                found.add(f"line {node.lineno}: {name}.{member}.{chain[i + 2]}")
            break
    return found


def reaches_past_the_port(source: str, parts: dict[str, type]) -> list[str]:
    """Every ``<port>.<name>`` the port does not list, and every ``<port>.<part>.<name>`` the part's view does not."""
    tree = ast.parse(source)
    port_members = _port_members()
    found = _reaches(tree, PORT_NAMES, parts, port_members)
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and (aliases := _aliases(function)):
            found |= _reaches(function, aliases, parts, port_members)
    return sorted(found, key=lambda reach: (int(reach.split()[1].rstrip(":")), reach))


def test_every_part_the_port_hands_out_is_a_read_only_view() -> None:
    parts = _parts()
    assert parts, "MasterPort declares its parts as properties"
    for name, view in parts.items():
        assert view.__module__ == views.__name__, f"MasterPort.{name} is a {view.__name__}, not a view of master/views.py"
        assert getattr(view, "_is_protocol", False), f"{view.__name__} is a Protocol"
    # Read-only: every attribute the port declares is a property, so management cannot replace a part either.
    assert set(MasterPort.__annotations__) == set(), "a part is a property typed by its view, not an attribute"


def test_management_reaches_nothing_past_the_port() -> None:
    parts = _parts()
    reaches = {}
    for path in sorted((ROOT / "management").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        found = [] if name in OTHER_MASTERS else reaches_past_the_port(path.read_text(), parts)
        if found:
            reaches[name] = found
    assert reaches == {}, "management reads the Master's parts through their views and writes through port operations"


def unused_members(source: str, parts: dict[str, type]) -> list[str]:
    """Each member of the port, and of each part's view, that ``source`` names nowhere as an attribute."""
    named = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    found = [f"MasterPort.{name}" for name in _port_members() - named]
    found += [f"{view.__name__}.{name}" for view in parts.values() for name in _members(view) - named]
    return sorted(found)


def test_the_port_and_its_views_list_only_what_management_uses() -> None:
    """The door is as wide as management's use of it: a member nothing in management names is an opening to close
    (the Master keeps it for itself; the port need not publish it)."""
    management = "\n".join(path.read_text() for path in sorted((ROOT / "management").rglob("*.py")))
    assert unused_members(management, _parts()) == []


def test_an_unused_member_of_the_port_is_named() -> None:
    members = _port_members() | {member for view in _parts().values() for member in _members(view)}
    used_by_all_but_one = "".join(f"master.{name}\n" for name in sorted(members))
    assert unused_members(used_by_all_but_one, _parts()) == []
    assert unused_members(used_by_all_but_one.replace("master.create_command\n", ""), _parts()) == ["MasterPort.create_command"]


def test_the_scan_catches_a_reach_past_a_view_and_a_write_on_a_part() -> None:
    reaching = textwrap.dedent(
        """
        async def fault(self, gpu, fault):
            await self._master.registry.mark_faulty(gpu, fault)
            await self.master.events.record("x", "y")
            self._master.on_elected.append(fault)
            self._master.store.agents.get("a")
            await self._master.mark_gpu_faulty(gpu, fault)
            self._master.registry.agents.get("a")

        def detail(self):
            m = self._master
            return m.telemetry.recent, m.registry.gpus
        """
    )
    assert reaches_past_the_port(reaching, _parts()) == [
        "line 3: _master.registry.mark_faulty",
        "line 4: master.events",
        "line 5: _master.on_elected",
        "line 6: _master.store.agents",
        "line 12: m.telemetry.recent",
    ]


# Lines 5 to 9 reach past the port; the rest goes through it and type-checks.
SNIPPET = """\
from master.port import AccountChange, GpuFault, MasterPort


async def reaching(master: MasterPort, fault: GpuFault) -> None:
    await master.registry.mark_faulty(master.registry.get("a"), fault)
    await master.accounts.update("acct", AccountChange(name="n"))
    await master.events.record("kind", "subject")
    master.on_elected.append(lambda: None)
    await master.store.agents.get("a")


async def through_the_door(master: MasterPort, fault: GpuFault) -> None:
    gpu = master.registry.gpus["uuid"]
    await master.mark_gpu_faulty(gpu, fault)
    await master.update_account("acct", AccountChange(name="n"))
    await master.record_event("kind", "subject", by="me")
    await master.store.revocations.list()
"""


def test_mypy_fails_a_module_that_reaches_past_the_port(tmp_path: Path) -> None:
    failing, report = failing_lines(SNIPPET, tmp_path, "reaching.py")
    assert failing == [5, 6, 7, 8, 9], report
