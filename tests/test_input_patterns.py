"""Every regular expression that guards input ends at the end of the text: Python's ``$`` also matches before a final
newline, so ``^[0-9]+$`` took "12\\n" (a price of 12.00 was accepted that way). Patterns end with ``\\Z`` (or are used
with ``fullmatch``); the OpenAPI document publishes them with ECMA's ``$``, which means the same there."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from common.containers import ContainerSpec
from management.api.routing import document
from management.market.money import BadAmount, parse_amount
from master.records import RentalTerms, WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "access", "master", "management", "common")


def test_no_whole_text_pattern_in_the_code_ends_with_a_dollar():
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if "extra_json_schema" in line:  # published only (ECMA's "$" is the end of the text), never matched
                    continue
                if re.search(r"""r?f?"\^[^"\n]*\$\"""", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "end these patterns with \\Z:\n" + "\n".join(offenders)


@pytest.mark.parametrize("text", ["12\n", " 12", "12 ", "1.5\n"])
def test_an_amount_with_a_newline_or_space_is_not_an_amount(text):
    with pytest.raises(BadAmount):
        parse_amount(text)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (RentalTerms, {"kind": "interruptible", "bid": "12\n"}),
        (RentalTerms, {"kind": "on_demand", "max_price": "1\n"}),
        (WorkloadSpec, {"name": "job\n", "image": "busybox"}),
        (WorkloadSpec, {"name": "job", "image": "busybox", "env": {"A\n": "1"}}),
        (WorkloadSpec, {"name": "job", "image": "busybox", "replica": {"min_compute_capability": "9.0\n"}}),
        (ContainerSpec, {"name": "c1\n", "image": "busybox"}),
    ],
)
def test_a_trailing_newline_fails_every_struct_pattern(kind, body):
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(body, kind)


def test_the_openapi_document_publishes_patterns_in_ecma_terms():
    patterns = re.findall(r'"pattern":\s*"((?:[^"\\]|\\.)*)"', msgspec.json.encode(document()).decode())
    assert patterns and not [p for p in patterns if p.endswith("\\\\Z")]
