"""Reading a console form: each field parsed on its own, each problem kept next to the field it is about.

A page collects ``FormErrors`` while reading its fields and renders the form again, with what was typed and the
errors beside the inputs, when any were found (status 400); nothing is done with a form that has errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from management.market.money import BadAmount, parse_amount

WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


# A posted form as aiohttp reads it (``await request.post()``: a MultiDictProxy of text and uploaded files), or a test's
# dict of the same: each page's fields are its own, read here one by one and checked, so it is open.
FormFields = Mapping[str, Any]


class FormErrors(dict[str, str]):
    """field name -> what is wrong with it, in words a person can act on."""

    def add(self, field: str, message: str) -> None:
        self.setdefault(field, message)


def text(form: FormFields, field: str, *, max_length: int = 4096) -> str:
    value = form.get(field, "")
    return value.strip()[:max_length] if isinstance(value, str) else ""


def word(form: FormFields, field: str, errors: FormErrors, *, label: str) -> str | None:
    """A name such as a GPU model, a tier or a region; None when left empty."""
    value = text(form, field)
    if not value:
        return None
    if not WORD.match(value):
        errors.add(field, f"{label}: letters, digits and . _ - : only (got {value[:40]!r})")
        return None
    return value


def integer(
    form: FormFields, field: str, errors: FormErrors, *, label: str, low: int, high: int, default: int | None = None
) -> int | None:
    value = text(form, field)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        errors.add(field, f"{label}: a whole number, not {value[:40]!r}")
        return None
    if not low <= number <= high:
        errors.add(field, f"{label}: from {low} to {high}, not {number}")
        return None
    return number


def number(form: FormFields, field: str, errors: FormErrors, *, label: str, low: float, high: float) -> float | None:
    value = text(form, field)
    if not value:
        return None
    try:
        parsed = float(value)
    except ValueError:
        errors.add(field, f"{label}: a number, not {value[:40]!r}")
        return None
    if not low <= parsed <= high:  # NaN fails here too
        errors.add(field, f"{label}: from {low:g} to {high:g}, not {value[:40]}")
        return None
    return parsed


def amount(form: FormFields, field: str, errors: FormErrors, *, label: str) -> str | None:
    """Money as the API takes it ("1.20"); None when left empty."""
    value = text(form, field)
    if not value:
        return None
    try:
        parse_amount(value)
    except BadAmount as exc:
        errors.add(field, f"{label}: {exc}")
        return None
    return value


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_VARIABLES = 256  # as WorkloadSpec.env takes them
MAX_ENV_VALUE = 32768


def environment(form: FormFields, field: str, errors: FormErrors) -> dict[str, str]:
    """Environment variables typed one ``NAME=value`` a line (blank lines and lines starting with # are skipped; the
    value is everything after the first =, kept as typed). A problem names its line."""
    value = form.get(field, "")
    variables: dict[str, str] = {}
    if not isinstance(value, str):
        return variables
    for number, line in enumerate(value.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, equals, rest = line.partition("=")
        name = name.strip()
        if not equals:
            errors.add(field, f"environment, line {number}: NAME=value, not {line[:40]!r}")
        elif not ENV_NAME.match(name):
            errors.add(field, f"environment, line {number}: {name[:40]!r} is not a variable name (letters, digits, _)")
        elif name in variables:
            errors.add(field, f"environment, line {number}: {name} is set twice")
        elif len(rest) > MAX_ENV_VALUE:
            errors.add(field, f"environment, line {number}: {name}'s value is over {MAX_ENV_VALUE} characters")
        else:
            variables[name] = rest
    if len(variables) > MAX_ENV_VARIABLES:
        errors.add(field, f"environment: at most {MAX_ENV_VARIABLES} variables, not {len(variables)}")
    return variables
