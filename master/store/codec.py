"""Records to what the backends store, shared by both: builtins (MongoDB documents) and JSON text (SQLite).

The last line of defence against poisoned state: a NaN or an infinity has no JSON form (msgspec writes
it as ``null``, which then fails to decode as a float), so a record holding one is refused here, naming
the field, before anything reaches the database.

The check runs on every write, so it is compiled once per record type from the type's fields: it
visits only the fields that can hold a float (most are strings and integers), and walks the values of
loosely typed fields (``dict[str, Any]``, e.g. a command's spec) in full. Before that walk, a record is
encoded as MessagePack (in C) and its bytes searched for a non-finite double's encoding: a record with
none, nearly every one, is cleared there; the walk runs only on a hit (which may be an integer's or a
string's bytes that look so: the walk then decides) or where MessagePack cannot encode the record. The
walk on every record was 5.5 % of the Master's loop in a 30,000-agent ramp (bench/HISTORY.md), most of it
the loose walk of each event's data. Only record types with a loose field are searched so: the compiled
check of a typed record (a GPU's, with its card's description) takes a third of the time of the encoding.
"""

from __future__ import annotations

import functools
import math
import re
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
_msgpack = msgspec.msgpack.Encoder()
# msgspec writes every float as a MessagePack float 64 (0xcb, then its 8 bytes, big-endian); NaN and the infinities are
# the doubles whose 11 exponent bits are all set: a first byte of 0x7f or 0xff, a second of 0xf0 or more.
_NON_FINITE_DOUBLE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")


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
    found = _record_check(type(rec))(rec)
    if found is not None:
        field, value = found
        raise UnstorableRecord(
            f"refusing to store {aggregate} record {key!r}: {field} is {value!r}, and a stored NaN or "
            "infinity cannot be read back; the value must be checked where it entered (API request, agent frame)"
        )


def surely_finite(rec: msgspec.Struct) -> bool:
    """Whether ``rec`` surely holds no NaN or infinite float, told from its MessagePack bytes; False where they look as
    if it might (or it has no MessagePack form): the field-by-field check decides then."""
    try:
        return _NON_FINITE_DOUBLE.search(_msgpack.encode(rec)) is None
    except (TypeError, ValueError, OverflowError):
        return False


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
def _record_check(struct_type: type[msgspec.Struct]) -> Check:
    """The check of a record as written: its compiled check, after ``surely_finite`` where that check walks a loosely
    typed value (``Any``, a dict or list of it), which costs several times the encoding."""
    check = _struct_check(struct_type)
    if not _walks_loosely(mi.type_info(struct_type)):
        return check

    def fast_check(rec: Any) -> tuple[str, float] | None:
        return None if surely_finite(rec) else check(rec)

    return fast_check


def _walks_loosely(t: mi.Type) -> bool:
    """Whether the check of a value of type ``t`` (``_value_check``) walks some value in it with ``non_finite_field``."""
    if not _may_hold_float(t) or isinstance(t, mi.FloatType):
        return False
    if isinstance(t, mi.StructType):
        return any(_walks_loosely(f.type) for f in t.fields)
    if isinstance(t, mi.UnionType):
        others = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if all(isinstance(m, mi.FloatType) for m in others):
            return False
        if len(others) == 1 and isinstance(others[0], mi.StructType):
            return _walks_loosely(others[0])
    return True


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
