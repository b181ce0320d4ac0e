"""The offer search language: space-separated conditions ``field op value``, parsed into a small typed AST.

    query     := term*                               (terms separated by white space)
    term      := "sort=" ["-"] field                  (descending with "-"; at most one)
               | field op value
               | field ("in" | "notin") "[" value ("," value)* "]"
    op        := "=" | "!=" | "<" | "<=" | ">" | ">="
    value     := number | "true" | "false" | bare word | "quoted string" | 'quoted string'

Every field has a kind (``FIELDS``): a number, an amount of money (compared in currency units, held as micro-units),
a version (compared numerically part by part: 12.10 > 12.2), a word (only = != in notin) or a boolean (= !=). A
query that does not parse, or names a field, operator or value its field cannot take, raises ``BadQuery`` with the
0-based position and the offending token in its message. docs/offers.md describes the fields.
"""

from __future__ import annotations

import re
from enum import Enum

import msgspec

from common.errors import BadQuery
from management.market.money import BadAmount, parse_amount


class Kind(str, Enum):
    NUMBER = "number"
    MONEY = "amount"  # currency units in a query ("2.5"), micro-units inside
    VERSION = "version"
    WORD = "word"
    BOOL = "boolean"


# The offer fields a query may name, and how their values compare (management/market/offers.py: Offer).
FIELDS: dict[str, Kind] = {
    "id": Kind.WORD,
    "host": Kind.WORD,
    "provider": Kind.WORD,
    "region": Kind.WORD,
    "model": Kind.WORD,
    "vendor": Kind.WORD,
    "tier": Kind.WORD,
    "runtime": Kind.WORD,
    "num_gpus": Kind.NUMBER,
    "num_gpus_on_demand": Kind.NUMBER,
    "total_gpus": Kind.NUMBER,
    "gpu_ram": Kind.NUMBER,
    "compute_capability": Kind.VERSION,
    "cuda": Kind.VERSION,
    "price": Kind.MONEY,
    "min_bid": Kind.MONEY,
    "reserved_price": Kind.MONEY,
    "max_duration_s": Kind.NUMBER,
    "reliability": Kind.NUMBER,
    "inet_down": Kind.NUMBER,
    "inet_up": Kind.NUMBER,
    "cpu_cores": Kind.NUMBER,
    "ram_gib": Kind.NUMBER,
    "disk_gib": Kind.NUMBER,
    "verified": Kind.BOOL,
    "interruptible": Kind.BOOL,
    "nvlink": Kind.BOOL,
    "score": Kind.NUMBER,
    "tflops": Kind.NUMBER,  # measured (docs/verification.md)
    "memory_bandwidth_gbs": Kind.NUMBER,
    "tflops_per_price": Kind.NUMBER,
}

COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
MEMBERSHIPS = ("in", "notin")
_OPS_OF = {
    Kind.NUMBER: COMPARISONS + MEMBERSHIPS,
    Kind.MONEY: COMPARISONS + MEMBERSHIPS,
    Kind.VERSION: COMPARISONS + MEMBERSHIPS,
    Kind.WORD: ("=", "!=") + MEMBERSHIPS,
    Kind.BOOL: ("=", "!="),
}
MAX_QUERY_CHARS = 4096
MAX_LIST_VALUES = 256

Version = tuple[int, ...]
Value = float | int | bool | str | Version  # number | micro-units | boolean | word | version

_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OP_CHARS = re.compile(r"[=!<>~]+")
_KEYWORD_OP = re.compile(r"(in|notin)(?=[\s\[])")
_BARE = re.compile(r"[^\s\[\],\"']+")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_VERSION = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9}){0,3}\Z")


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """``field op value``; for ``in``/``notin`` the value is a tuple of values. ``text`` is the condition as written
    and ``position`` where it starts, so an answer can say which condition emptied a search."""

    field: str
    op: str
    value: Value | tuple[Value, ...]
    text: str
    position: int


class SortKey(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    descending: bool = False

    def __str__(self) -> str:
        return f"{'-' if self.descending else ''}{self.field}"


DEFAULT_SORT = SortKey(field="score", descending=True)


class Query(msgspec.Struct, frozen=True, kw_only=True):
    conditions: tuple[Condition, ...] = ()
    sort: SortKey | None = None  # None: the caller's sort, else DEFAULT_SORT


def parse_version(text: str) -> Version:
    """``"12.2"`` -> (12, 2), ``"9.0"`` -> (9,) (trailing zeros do not count); ValueError for anything but
    dot-separated whole numbers (at most four parts)."""
    if not _VERSION.match(text):
        raise ValueError(f"{text!r} is not a version such as 12.2")
    parts = [int(part) for part in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 12.0 is 12: equal, not greater
        parts.pop()
    return tuple(parts)


def parse_sort(text: str, *, position: int = 0) -> SortKey:
    """``"price"`` / ``"-reliability"``: a field to sort by, ``-`` for descending."""
    descending = text.startswith("-")
    name = text[1:] if descending else text
    if name not in FIELDS:
        raise BadQuery(
            f"position {position}: cannot sort by {name!r}: not an offer field (one of {', '.join(FIELDS)})",
            position=position,
            token=text,
        )
    return SortKey(field=name, descending=descending)


def parse_query(text: str) -> Query:
    """The AST of ``text`` (an empty text: no condition); BadQuery naming position and token when it is not one."""
    if len(text) > MAX_QUERY_CHARS:
        raise BadQuery(f"the query is {len(text)} characters long; at most {MAX_QUERY_CHARS}", position=MAX_QUERY_CHARS)
    return _Parser(text).query()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str, token: str, position: int | None = None) -> BadQuery:
        at = self.pos if position is None else position
        return BadQuery(f"position {at}: {message}", position=at, token=token)

    def token_here(self) -> str:
        """The text at the cursor up to the next white space, for an error message ('' at the end)."""
        match = re.compile(r"\S+").match(self.text, self.pos)
        return match.group(0) if match else ""

    def found(self) -> str:
        token = self.token_here()
        return f"found {token!r}" if token else "found the end of the query"

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def query(self) -> Query:
        conditions: list[Condition] = []
        sort: SortKey | None = None
        self.skip_space()
        while self.pos < len(self.text):
            start = self.pos
            match = _FIELD.match(self.text, self.pos)
            if match is None:
                raise self.fail(f"expected a field name, {self.found()}", self.token_here())
            name = match.group(0)
            self.pos = match.end()
            if name == "sort" and self.text.startswith("=", self.pos):
                if sort is not None:
                    raise self.fail("sort is given twice; give one sort=field or sort=-field", name, start)
                self.pos += 1
                token_at = self.pos
                token = _BARE.match(self.text, self.pos)
                if token is None:
                    raise self.fail(f"expected a field to sort by after 'sort=', {self.found()}", self.token_here())
                self.pos = token.end()
                sort = parse_sort(token.group(0), position=token_at)
            else:
                conditions.append(self.condition(name, start))
            if self.pos < len(self.text) and not self.text[self.pos].isspace():
                raise self.fail(f"expected a space before the next condition, {self.found()}", self.token_here())
            self.skip_space()
        return Query(conditions=tuple(conditions), sort=sort)

    def condition(self, name: str, start: int) -> Condition:
        kind = FIELDS.get(name)
        if kind is None:
            raise self.fail(f"unknown field {name!r}; an offer has: {', '.join(FIELDS)}", name, start)
        self.skip_space()
        op_at = self.pos
        keyword = _KEYWORD_OP.match(self.text, self.pos)
        if keyword is not None:
            op = keyword.group(1)
            self.pos = keyword.end()
        else:
            symbols = _OP_CHARS.match(self.text, self.pos)
            op = symbols.group(0) if symbols else ""
            if op not in COMPARISONS:
                found = f"found {op!r}" if op else self.found()
                raise self.fail(f"expected an operator after {name!r}, {found}", op or self.token_here())
            self.pos = symbols.end() if symbols else self.pos
        if op not in _OPS_OF[kind]:
            allowed = " ".join(_OPS_OF[kind])
            raise self.fail(f"{name} is a {kind.value} field: it takes {allowed}, not {op!r}", op, op_at)
        self.skip_space()
        value: Value | tuple[Value, ...]
        if op in MEMBERSHIPS:
            value = self.value_list(name, kind)
        else:
            value = self.value(name, kind)
        return Condition(field=name, op=op, value=value, text=self.text[start : self.pos], position=start)

    def value_list(self, name: str, kind: Kind) -> tuple[Value, ...]:
        if not self.text.startswith("[", self.pos):
            raise self.fail(f"expected '[' to open the list of values of {name}, {self.found()}", self.token_here())
        self.pos += 1
        values: list[Value] = []
        while True:
            self.skip_space()
            values.append(self.value(name, kind))
            self.skip_space()
            if len(values) > MAX_LIST_VALUES:
                raise self.fail(f"a list may hold at most {MAX_LIST_VALUES} values", self.token_here())
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return tuple(values)
            raise self.fail(f"expected ',' or ']' in the list of values of {name}, {self.found()}", self.token_here())

    def value(self, name: str, kind: Kind) -> Value:
        at = self.pos
        if self.pos < len(self.text) and self.text[self.pos] in "\"'":
            quote = self.text[self.pos]
            end = self.text.find(quote, self.pos + 1)
            if end < 0:
                raise self.fail(f"the quoted value of {name} is not closed with {quote}", self.text[self.pos :])
            raw = self.text[self.pos + 1 : end]
            self.pos = end + 1
            if kind is not Kind.WORD:
                return self.typed(raw, name, kind, at)
            return raw
        match = _BARE.match(self.text, self.pos)
        if match is None:
            raise self.fail(f"expected a value for {name}, {self.found()}", self.token_here())
        self.pos = match.end()
        return self.typed(match.group(0), name, kind, at)

    def typed(self, raw: str, name: str, kind: Kind, at: int) -> Value:
        if kind is Kind.WORD:
            return raw
        if kind is Kind.BOOL:
            if raw.lower() in ("true", "false"):
                return raw.lower() == "true"
            raise self.fail(f"{name} is true or false, not {raw!r}", raw, at)
        if kind is Kind.VERSION:
            try:
                return parse_version(raw)
            except ValueError:
                raise self.fail(f"{name} takes a version such as 12.2, not {raw!r}", raw, at) from None
        if kind is Kind.MONEY:
            try:
                return parse_amount(raw)
            except BadAmount:
                raise self.fail(
                    f"{name} takes an amount such as 2.5 (no sign, 6 decimals at most), not {raw!r}", raw, at
                ) from None
        if not _NUMBER.match(raw):
            raise self.fail(f"{name} takes a number, not {raw!r}", raw, at)
        return float(raw)
