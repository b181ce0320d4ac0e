"""Records to what the backends store, shared by both: builtins (MongoDB documents) and JSON text (SQLite).

The last line of defence against poisoned state: a NaN or an infinity has no JSON form (msgspec writes
it as ``null``, which then fails to decode as a float), so a record holding one is refused here, naming
the field, before anything reaches the database.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from master.store.aggregates import Aggregate
from master.store.errors import UnstorableRecord

_json = msgspec.json.Encoder()


def to_document(aggregate: Aggregate, key: object, rec: msgspec.Struct) -> dict[str, Any]:
    """``rec`` as builtins; UnstorableRecord if any float in it is NaN or infinite."""
    doc = msgspec.to_builtins(rec)
    assert isinstance(doc, dict)
    found = non_finite_field(doc)
    if found is not None:
        field, value = found
        raise UnstorableRecord(
            f"refusing to store {aggregate.value} record {key!r}: {field} is {value!r}, and a stored NaN or "
            "infinity cannot be read back; the value must be checked where it entered (API request, agent frame)"
        )
    return doc


def to_json(aggregate: Aggregate, key: object, rec: msgspec.Struct) -> str:
    """``rec`` as JSON text, refused as ``to_document`` refuses it."""
    return _json.encode(to_document(aggregate, key, rec)).decode()


def non_finite_field(value: Any, path: str = "") -> tuple[str, float] | None:
    """The dotted path and value of the first NaN or infinite float in nested builtins, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        children: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for child_path, child in children:
        found = non_finite_field(child, child_path)
        if found is not None:
            return found
    return None
