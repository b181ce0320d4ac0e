"""docs/architecture.md's recipes name files that exist, and the one for an agent frame stays true: every file it names
exists, the lane is declared where it says, and the files it says only read the lane name no frame kind of their own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from common.lanes import Lane
from common.wire import LANE_OF_KIND, NEVER_RATE_LIMITED, QUEUED_FRAMES

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Where the frame's lane is read, never written: a frame kind named in one of these would be a second home.
LANE_READERS = ("access/relay.py", "access/upstream.py", "master/intake.py")


def recipe(title: str) -> str:
    """The text of the "Where to add" bullet that starts with ``- **<title>**``, its sub-bullets included."""
    text = ARCHITECTURE.read_text()
    start = text.index(f"- **{title}**")
    following = re.compile(r"^- \*\*", re.M).search(text, start + 1)
    return text[start : following.start() if following else len(text)]


def named_files(text: str) -> list[str]:
    """Every repository path the text names (in backticks or bare), as written."""
    return sorted(set(re.findall(r"(?<![\w/.])((?:[a-z_]+/)+[a-z_]+\.(?:py|md))", text)))


FRAME_RECIPE = recipe("An agent frame")


def where_to_add() -> str:
    """docs/architecture.md's "Where to add" section: every recipe."""
    text = ARCHITECTURE.read_text()
    start = text.index("## Where to add")
    return text[start : text.index("\n## ", start + 1)]


def test_every_file_any_recipe_names_exists():
    """A file moved or removed (``management/views.py`` became ``management/views/``) is a recipe to rewrite."""
    files = named_files(where_to_add())
    assert len(files) > 20
    missing = [name for name in files if not (ROOT / name).is_file()]
    assert missing == [], f"docs/architecture.md's recipes name files that do not exist: {missing}"


def test_every_file_the_frame_recipe_names_exists():
    files = named_files(FRAME_RECIPE)
    assert files, "the recipe names no file"
    missing = [name for name in files if not (ROOT / name).is_file()]
    assert missing == [], f"docs/architecture.md's agent frame recipe names files that do not exist: {missing}"


def test_the_frame_recipe_names_each_file_a_new_frame_touches():
    needed = {"common/wire.py", "master/session.py", "master/agent_channel.py", "agent/daemon.py", "tests/master/linked.py"}
    assert needed <= set(named_files(FRAME_RECIPE))


def test_the_lane_is_declared_where_the_recipe_says():
    assert "`common/wire.py`: the struct, its tag in the `AgentFrame` union, and its `lane`" in FRAME_RECIPE
    for frame in QUEUED_FRAMES:
        assert isinstance(vars(frame).get("lane"), Lane), f"{frame.__name__} declares no lane in common/wire.py"


def kinds_named_in(path: Path) -> set[str]:
    """String constants in ``path`` outside docstrings and comments that are a queued frame kind with a rule of its own."""
    special = {kind for kind, lane in LANE_OF_KIND.items() if lane is not Lane.CONTROL} | NEVER_RATE_LIMITED
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and node.value in special
    }


def test_the_lane_readers_name_no_frame_kind_of_their_own():
    for name in LANE_READERS:
        assert f"`{name}`" in FRAME_RECIPE, f"the recipe no longer says {name} reads the lane"
        assert kinds_named_in(ROOT / name) == set(), f"{name} names frame kinds itself: read them from common/wire.py"


def test_a_reader_naming_a_kind_is_caught(tmp_path):
    reader = tmp_path / "reader.py"
    reader.write_text('"""Mentions "heartbeat" in its docstring only."""\nTELEMETRY = frozenset({"heartbeat", "telemetry"})\n')
    assert kinds_named_in(reader) == {"heartbeat", "telemetry"}


STORE_RECIPE = recipe("A management resource's stored aggregate")


def test_the_stored_aggregate_recipe_names_files_that_exist_and_one_master_file_to_edit():
    files = named_files(STORE_RECIPE)
    missing = [name for name in files if not (ROOT / name).is_file()]
    assert missing == [], f"docs/architecture.md's stored aggregate recipe names files that do not exist: {missing}"
    edited_in_master = {name for name in files if name.startswith("master/")} - {"master/store/plugin.py"}
    assert edited_in_master == {"master/store/migrations.py", "master/records.py", "master/port.py"}
    assert "the one master/ file it touches" in STORE_RECIPE
    assert {"management/store/__init__.py", "master/store/migrations.py"} <= set(files)
