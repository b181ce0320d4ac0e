"""A command's body is typed from its maker to the ledger: ``create_command`` takes a ``ContainerSpec`` or a
``DeleteSpec``, the kind follows from the type, and the ledger alone encodes it to the JSON it signs and sends,
checking it against its type's constraints there (a struct built directly was never checked: msgspec checks its
``Meta`` constraints only when it converts or decodes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.containers import ContainerSpec, DeleteSpec, parse_create_spec, wire_spec
from common.wire import Command
from master.commands import InvalidCommand, command_spec
from master.master import Master
from tests.master.linked import connect, relay_link, to_agent
from tests.support.typecheck import failing_lines


async def test_the_kind_follows_from_the_type_and_the_agent_gets_the_spec_as_wire_spec_writes_it(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    spec = ContainerSpec(name="job", image="none", gpus=["0"], ports=[8080])
    create = await master.create_command("agt-a", spec)
    delete = await master.create_command("agt-a", DeleteSpec(name="job", timeout_s=30))

    assert (create.kind, delete.kind) == ("create_container", "delete_container")
    sent = {frame.body.id: frame.body for frame in to_agent(link, "agt-a") if isinstance(frame, Command)}
    assert sent[create.id].spec == wire_spec(spec) == {"name": "job", "image": "none", "gpus": ["0"], "ports": [8080]}
    assert parse_create_spec(sent[create.id].spec) == spec
    assert sent[delete.id].spec == {"name": "job", "timeout_s": 30.0}


async def test_a_spec_built_directly_that_breaks_its_constraints_is_refused_before_anything_is_kept(master: Master) -> None:
    await connect(master, relay_link(), "agt-a")
    unchecked = ContainerSpec(name="not a name!", image="none", gpus=["0"])  # built directly: msgspec checked nothing

    with pytest.raises(InvalidCommand, match=r"invalid create_container spec: Expected `str` matching regex .* at `\$\.name`"):
        await master.create_command("agt-a", unchecked)
    with pytest.raises(InvalidCommand, match=r"invalid delete_container spec: Expected `float` <= 600.0 - at `\$\.timeout_s`"):
        await master.create_command("agt-a", DeleteSpec(name="job", timeout_s=601))
    assert await master.list_commands(agent_id="agt-a") == []
    assert [g.state for g in master.gpus("agt-a")] == ["available", "available"]


def test_a_raw_spec_becomes_typed_once_and_a_bad_one_names_its_kind_and_field() -> None:
    assert command_spec("delete_container", {"name": "x"}) == DeleteSpec(name="x")
    assert command_spec("create_container", {"name": "x", "image": "i", "command": []}) == ContainerSpec(name="x", image="i")
    unknown = "^unknown command kind 'format_disk'; expected one of create_container, delete_container$"
    with pytest.raises(InvalidCommand, match=unknown):
        command_spec("format_disk", {})
    with pytest.raises(InvalidCommand, match=r"^invalid create_container spec: Object missing required field `image`$"):
        command_spec("create_container", {"name": "x"})
    with pytest.raises(InvalidCommand, match=r"^invalid create_container spec: Object contains unknown field `privileged`$"):
        command_spec("create_container", {"name": "x", "image": "i", "privileged": True})
    with pytest.raises(InvalidCommand, match=r"^invalid create_container spec: label key 'io.idlegrid.x' is reserved"):
        command_spec("create_container", {"name": "x", "image": "i", "labels": {"io.idlegrid.x": "1"}})


# Lines 6 and 7 hand create_command what is not a typed body; line 8 does.
SNIPPET = """\
from common.containers import DeleteSpec
from master.port import MasterPort


async def commands(master: MasterPort) -> None:
    await master.create_command("agt-a", {"name": "x"})
    await master.create_command("agt-a", "delete_container", {"name": "x"})
    await master.create_command("agt-a", DeleteSpec(name="x"), timeout_s=5.0)
"""


def test_mypy_fails_a_command_whose_body_is_a_dict_or_names_its_kind(tmp_path: Path) -> None:
    failing, report = failing_lines(SNIPPET, tmp_path, "commands.py")
    assert failing == [6, 7], report
