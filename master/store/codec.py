"""Records to what the backends store, shared by both: builtins (MongoDB documents) and JSON text (SQLite).

The last line of defence against poisoned state: a NaN or an infinity has no JSON form (msgspec writes
it as ``null``, which then fails to decode as a float), so a record holding one is refused here, naming
the field, before anything reaches the database.

The check runs on every write, so it is compiled once per record type from the type's fields: it
visits only the fields that can hold a float (most are strings and integers), and walks the values of
loosely typed fields (``dict[str, Any]``, e.g. a command's spec) in full.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from master.store.errors import UnstorableRecord

# A check takes a value and returns the path inside it (relative: "" is the value itself) and the value of
# its first non-finite float, or None.
Check = Callable[[Any], tuple[str, float] | None]
# A BSON document (a record's, a query, an update) as PyMongo takes and returns it: its shape is the codec's (a
# record's builtins, decoded back by msgspec) or the query language's, so it is open here.
Document = dict[str, Any]

_json = msgspec.json.Encoder()


def to_document(aggregate: str, key: object, rec: msgspec.Struct) -> Document:
    """``rec`` as builtins; UnstorableRecord if any float in it is NaN or infinite."""
    refuse_non_finite(aggregate, key, rec)
    doc = msgspec.to_builtins(rec)
    assert isinstance(doc, dict)
    return doc


def to_json(aggregate: str, key: object, rec: msgspec.Struct) -> str:
    """``rec`` as JSON text, refused as ``to_document`` refuses it."""
    refuse_non_finite(aggregate, key, rec)
    return _json.encode(rec).decode()


def refuse_non_finite(aggregate: str, key: object, rec: msgspec.Struct) -> None:
    found = _struct_check(type(rec))(rec)
    if found is not None:
        field, value = found
        raise UnstorableRecord(
            f"refusing to store {aggregate} record {key!r}: {field} is {value!r}, and a stored NaN or "
            "infinity cannot be read back; the value must be checked where it entered (API request, agent frame)"
        )


def non_finite_field(value: Any) -> tuple[str, float] | None:
    """The path (``a.b[2]``) and value of the first NaN or infinite float in nested builtins or structs, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else ("", value)
    if isinstance(value, dict):
        children: Any = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        children = ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, msgspec.Struct):
        return _struct_check(type(value))(value)
    else:
        return None
    for name, child in children:
        found = non_finite_field(child)
        if found is not None:
            return _join(name, found)
    return None


def _join(name: str, found: tuple[str, float]) -> tuple[str, float]:
    inner, value = found
    if not inner:
        return name, value
    return (f"{name}{inner}" if inner.startswith("[") else f"{name}.{inner}"), value


def _check_float(value: Any) -> tuple[str, float] | None:
    """A float field (or an optional one: None passes)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "", value
    return None


@functools.cache
def _struct_check(struct_type: type[msgspec.Struct]) -> Check:
    """The check of one record type: its float-capable fields, each by its own check."""
    info = mi.type_info(struct_type)
    assert isinstance(info, mi.StructType)
    checked = [(f.name, field_check) for f in info.fields if (field_check := _value_check(f.type)) is not None]

    def check_record(rec: Any) -> tuple[str, float] | None:
        for name, field_check in checked:
            found = field_check(getattr(rec, name))
            if found is not None:
                return _join(name, found)
        return None

    return check_record


def _value_check(t: mi.Type) -> Check | None:
    """How to check a value of type ``t``; None when it can hold no float."""
    if not _may_hold_float(t):
        return None
    if isinstance(t, mi.FloatType):
        return _check_float
    if isinstance(t, mi.StructType):
        return _struct_check(t.cls)
    if isinstance(t, mi.UnionType):
        others = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if all(isinstance(m, mi.FloatType) for m in others):
            return _check_float
        if len(others) == 1 and isinstance(others[0], mi.StructType):
            inner = _struct_check(others[0].cls)
            return lambda value: None if value is None else inner(value)
    return non_finite_field  # containers and Any: walk the value itself


def _may_hold_float(t: mi.Type) -> bool:
    if isinstance(t, mi.FloatType | mi.AnyType):
        return True
    if isinstance(t, mi.StructType):
        return any(_may_hold_float(f.type) for f in t.fields)
    if isinstance(t, mi.DictType):
        return _may_hold_float(t.value_type)
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _may_hold_float(t.item_type)
    if isinstance(t, mi.TupleType | mi.UnionType):
        members = t.item_types if isinstance(t, mi.TupleType) else t.types
        return any(_may_hold_float(m) for m in members)
    return False
