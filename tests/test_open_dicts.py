"""Issue 38: ``dict[str, Any]`` in management/ and master/ only where the data is truly open, each saying why.

Every ``dict[str, Any]``, ``Dict[str, Any]`` and ``Mapping[str, Any]`` (an annotation, a type argument, a cast)
must be the value of a module-level alias whose definition carries a comment (on its line or the line above) saying
why the data is open. Elsewhere, use one of the aliases below or type the data (a msgspec Struct, a TypedDict, a
dataclass) when its shape is fixed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("management", "master")
OPEN_CONTAINERS = {"dict", "Dict", "Mapping"}
# Where each kind of open data has its alias: the message names them so that new code reuses one.
KNOWN_ALIASES = """\
  alias             defined in (management imports master's from master/port.py)  for
  AnswerJson        management/client/api.py       an API answer as the client (the CLI, a console page) decodes it
  BodyJson          management/client/api.py       a request body the CLI builds by hand, checked by the API's Struct
  SpecJson          master/port.py                 a workload spec (or a piece of one) as JSON, before WorkloadSpec
  WireSpec          common/containers.py           a command's spec as JSON
  EventData         master/records.py              an event's data
  AgentResult       master/records.py (port)       what an agent reported of a command
  RuleSpec          master/records.py (port)       an alert rule's fields
  TierJson          master/tiers.py (port)         a tier's criteria as the policy file wrote them
  Document          master/store/codec.py (kit)    a BSON document or query as PyMongo takes and returns it
  TomlTable         common/config.py               a TOML table (or JSON object) before its reader checks it
  StructFields      management/views/base.py       keyword arguments gathered for a Struct or a call
  OpenApiJson       management/http/schemas.py     an OpenAPI document or a piece of one (JSON Schema)
  FormFields        management/console/forms.py    a posted form as aiohttp reads it
  TemplateContext   management/console/rendering.py  what a Jinja template or a page's chart script reads"""


def _is_open_dict(node: ast.AST) -> bool:
    if not isinstance(node, ast.Subscript):
        return False
    container = node.value
    name = container.attr if isinstance(container, ast.Attribute) else getattr(container, "id", None)
    if name not in OPEN_CONTAINERS or not isinstance(node.slice, ast.Tuple) or len(node.slice.elts) != 2:
        return False
    key, value = node.slice.elts
    any_value = isinstance(value, ast.Name) and value.id == "Any"
    any_value = any_value or (isinstance(value, ast.Attribute) and value.attr == "Any")
    return isinstance(key, ast.Name) and key.id == "str" and any_value


def _commented(lines: list[str], lineno: int) -> bool:
    """A comment on the alias's line, or on the line just above it."""
    here = lines[lineno - 1]
    above = lines[lineno - 2].strip() if lineno >= 2 else ""
    return "#" in here or above.startswith("#")


def offenders(path: Path, shown: str) -> list[str]:
    """``shown:line`` of each bare open dict in ``path``: not the whole value of a commented module-level alias."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    allowed: set[int] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and _is_open_dict(value) and _commented(lines, statement.lineno):
            allowed.add(id(value))
    bare = [node for node in ast.walk(tree) if isinstance(node, ast.Subscript) and _is_open_dict(node)]
    bare = [node for node in bare if id(node) not in allowed]
    bare.sort(key=lambda node: (node.lineno, node.col_offset))
    return [f"{shown}:{node.lineno}: {ast.unparse(node)}" for node in bare]


def test_open_dicts_are_named_and_say_why():
    found = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += offenders(path, str(path.relative_to(ROOT)))
    assert not found, (
        "bare open dicts (issue 38): type the data when its shape is fixed (a msgspec Struct, a TypedDict, a "
        "dataclass), else use the alias for its kind of open data, or define one with a comment saying why it is "
        "open:\n" + KNOWN_ALIASES + "\noffenders:\n" + "\n".join(found)
    )


def test_a_planted_bare_dict_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from collections.abc import Mapping\n"
        "from typing import Any, Dict\n"
        "import typing\n"
        "# A renter's labels: open, the renter names them.\n"
        "Labels = dict[str, Any]\n"
        "Silent = dict[str, Any]\n"
        "Said = Mapping[str, Any]  # a form, open\n"
        "def f(a: dict[str, Any], b: Labels) -> Mapping[str, typing.Any]:\n"
        "    c: list[Dict[str, Any]] = []\n"
        "    d: dict[str, int] = {}\n"
        "    return {}\n"
        "class C:\n"
        "    # a field, not an alias: still found\n"
        "    e: dict[str, Any] = {}\n"
    )
    assert offenders(planted, "planted.py") == [
        "planted.py:6: dict[str, Any]",
        "planted.py:8: dict[str, Any]",
        "planted.py:8: Mapping[str, typing.Any]",
        "planted.py:9: Dict[str, Any]",
        "planted.py:14: dict[str, Any]",
    ]


def test_the_aliases_the_message_names_are_defined_where_it_says():
    missing = []
    for line in KNOWN_ALIASES.splitlines()[1:]:
        name, path = line.split()[:2]
        if f"\n{name} = " not in (ROOT / path).read_text():
            missing.append(f"{name} in {path}")
    assert missing == []
