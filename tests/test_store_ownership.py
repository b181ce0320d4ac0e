"""Who owns which aggregate of the one store (docs/store.md, "Who owns what"): management's are declared in
management/store/ and reach the store through its plugin seam, so master/ names none of them but in the migration
sequence (which makes their tables), and adding one touches no other master/ file. The seam itself, on every backend,
with a throwaway aggregate: tests/master/test_store_plugin.py."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

from management.store import AGGREGATES
from master.store import Aggregate, Store
from master.views import ManagementStore

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = "master/store/migrations.py"  # the one sequence: a management aggregate's table is a step of it
MANAGEMENT_STORE = ROOT / "management" / "store"


def _plugin_names() -> set[str]:
    return {plugin.name for plugin in AGGREGATES}


def _declared_in_management_store() -> set[str]:
    """The classes and functions management/store/ declares: its repositories, their interfaces, keys and errors."""
    names = set()
    for path in MANAGEMENT_STORE.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                names.add(node.name)
    return names - {"attach"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def names_of_management_aggregates(path: Path, aggregates: set[str], declared: set[str]) -> list[str]:
    """Where ``path`` names a management aggregate: its table as a string (docstrings aside), or a class or function
    of management/store/ (imported, referred to or declared again)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"line {node.lineno}: {name!r}" for name in sorted(aggregates) if _names_table(node.value, name)]
        elif isinstance(node, ast.Name | ast.Attribute | ast.ClassDef | ast.FunctionDef | ast.alias):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
            if name in declared:
                found.append(f"line {node.lineno}: {name}")
    return sorted(set(found), key=lambda hit: (int(hit.split(":")[0].removeprefix("line ")), hit))


def _names_table(text: str, table: str) -> bool:
    """Whether a string is the table's name, or SQL that reads or writes it (prose that says "rentals" is not)."""
    return text == table or re.search(rf"\b(FROM|INTO|UPDATE|TABLE|ON|JOIN)\s+{table}\b", text) is not None


def test_management_s_aggregates_are_not_the_store_s_own() -> None:
    assert len(_plugin_names()) == len(AGGREGATES)  # each name once
    assert _plugin_names().isdisjoint(str(a) for a in Aggregate)
    assert _plugin_names() == {
        "workloads", "outputs", "fair_share", "prices", "rentals", "ledger", "alert_rules", "silences", "webhooks", "ssh_keys",
        "endpoints", "endpoint_keys",
        "endpoint_requests",
        "topups", "payment_events",
        "billing",
        "disputes",
        "payout_accounts", "payouts",
    }  # fmt: skip


def test_the_store_s_interfaces_name_no_management_aggregate() -> None:
    for protocol in (Store, ManagementStore):
        members = set(typing.get_type_hints(protocol)) | {name for name in vars(protocol) if not name.startswith("_")}
        assert members.isdisjoint(_plugin_names()), f"{protocol.__name__} still has a management aggregate by name"


def test_no_master_module_but_the_migrations_names_a_management_aggregate_s_table() -> None:
    declared = _declared_in_management_store()
    assert {"WorkloadRepo", "SqliteRentalRepo", "MongoLedgerRepo", "rental_order", "StaleRental"} <= declared
    found = {}
    for path in sorted((ROOT / "master").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        aggregates = set() if name == MIGRATIONS else _plugin_names() - _master_words(name)
        hits = names_of_management_aggregates(path, aggregates, declared)
        if hits:
            found[name] = hits
    assert found == {}, "master/ names management's aggregates: they are management/store/'s (docs/store.md)"


def _master_words(name: str) -> set[str]:
    """Words that are a management aggregate's table name and mean something else in a module of the Master's: the
    reputation's "rentals" factor (a host's completed and failed rentals, counted on its agent record)."""
    return {"rentals"} if name in {"master/reputation.py", "master/requests.py"} else set()


def test_the_scan_finds_a_management_aggregate_named_in_a_master_module(tmp_path: Path) -> None:
    module = tmp_path / "reaching.py"
    module.write_text(
        '"""Keeps "ledger" in its docstring only."""\n'
        "from management.store.rentals import rental_order\n"
        'TABLES = ("agents", "ledger", "SELECT doc FROM webhooks", "prose about rentals")\n'
        "class WorkloadRepo: ...\n"
    )
    assert names_of_management_aggregates(module, _plugin_names(), _declared_in_management_store()) == [
        "line 2: rental_order",
        "line 3: 'ledger'",
        "line 3: 'webhooks'",
        "line 4: WorkloadRepo",
    ]


def test_a_management_aggregate_is_one_module_of_management_store() -> None:
    modules = {path.stem for path in MANAGEMENT_STORE.glob("*.py")} - {"__init__"}
    for plugin in AGGREGATES:
        owner = type(plugin.sqlite).__module__ if not isinstance(plugin.sqlite, type) else plugin.sqlite.__module__
        assert owner.startswith("management.store."), f"{plugin.name}'s SQLite repository lives in {owner}"
        assert owner.removeprefix("management.store.") in modules
        assert getattr(plugin.mongo, "__module__", "") == owner, f"{plugin.name}'s two backends live apart"
