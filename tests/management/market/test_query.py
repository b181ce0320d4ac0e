"""The offer search language: what parses into which conditions, and what is refused with which position and token."""

from __future__ import annotations

import pytest

from common.errors import BadQuery
from management.market.query import FIELDS, Condition, SortKey, parse_query, parse_sort, parse_version

EXAMPLE = (
    "gpu_ram>=24 num_gpus>=4 tier=training model in [h100-sxm,h200] reliability>0.95 region=eu-west price<=2.5 "
    "cuda>=12.2 inet_down>=500 verified=true"
)


def test_the_issue_example_parses_into_typed_conditions_in_query_order():
    query = parse_query(EXAMPLE)
    assert [(c.field, c.op, c.value) for c in query.conditions] == [
        ("gpu_ram", ">=", 24.0),
        ("num_gpus", ">=", 4.0),
        ("tier", "=", "training"),
        ("model", "in", ("h100-sxm", "h200")),
        ("reliability", ">", 0.95),
        ("region", "=", "eu-west"),
        ("price", "<=", 2_500_000),  # money: micro-units, never a float
        ("cuda", ">=", (12, 2)),
        ("inet_down", ">=", 500.0),
        ("verified", "=", True),
    ]
    assert query.sort is None
    model = query.conditions[3]
    assert (model.text, model.position) == ("model in [h100-sxm,h200]", EXAMPLE.index("model"))


def test_values_may_be_quoted_lists_may_have_spaces_and_notin_excludes():
    query = parse_query("""region notin [ "us-east" , 'eu west' ] host="node 7" """)
    assert query.conditions == (
        Condition(
            field="region",
            op="notin",
            value=("us-east", "eu west"),
            text="""region notin [ "us-east" , 'eu west' ]""",
            position=0,
        ),
        Condition(field="host", op="=", value="node 7", text='host="node 7"', position=39),
    )


def test_sort_is_part_of_the_query_ascending_or_descending():
    assert parse_query("sort=price num_gpus>=2").sort == SortKey(field="price")
    assert parse_query("num_gpus>=2 sort=-reliability").sort == SortKey(field="reliability", descending=True)
    assert parse_sort("-score") == SortKey(field="score", descending=True)
    assert parse_query("").conditions == () and parse_query("   ").sort is None


def test_versions_compare_numerically_part_by_part():
    assert parse_version("12.10") > parse_version("12.2") > parse_version("12")
    assert parse_version("9.0") < parse_version("10.0")
    assert parse_version("12.2.0") == parse_version("12.2") and parse_version("9.0") == parse_version("9")
    assert parse_version("12") < parse_version("12.0.1")
    with pytest.raises(ValueError):
        parse_version("12.x")


@pytest.mark.parametrize(
    ("text", "position", "token", "says"),
    [
        ("num_gpus>=4 gpu_ram=>24", 19, "=>", "position 19: expected an operator after 'gpu_ram', found '=>'"),
        ("gpu_ram 24", 8, "24", "expected an operator after 'gpu_ram', found '24'"),
        ("colour=red", 0, "colour", "unknown field 'colour'"),
        ("region<eu", 6, "<", "region is a word field: it takes = != in notin, not '<'"),
        ("verified>=true", 8, ">=", "verified is a boolean field"),
        ("verified=yes", 9, "yes", "verified is true or false, not 'yes'"),
        ("cuda>=12.x", 6, "12.x", "cuda takes a version such as 12.2"),
        ("gpu_ram>=lots", 9, "lots", "gpu_ram takes a number, not 'lots'"),
        ("price<=2.1234567", 7, "2.1234567", "price takes an amount"),
        ("price<=-1", 7, "-1", "price takes an amount"),
        ("model in h100", 9, "h100", "expected '[' to open the list of values of model"),
        ("model in [a b]", 12, "b]", "expected ',' or ']'"),
        ("model in [a,", 12, "", "found the end of the query"),
        ('host="node', 5, '"node', "is not closed"),
        ("gpu_ram>=", 9, "", "expected a value for gpu_ram, found the end of the query"),
        ("sort=colour", 5, "colour", "cannot sort by 'colour'"),
        ("sort=price sort=score", 11, "sort", "sort is given twice"),
        ("region=eu]", 9, "]", "expected a space before the next condition"),
        ("=5", 0, "=5", "expected a field name"),
    ],
)
def test_a_query_that_is_not_one_is_refused_with_its_position_and_token(text, position, token, says):
    with pytest.raises(BadQuery) as refused:
        parse_query(text)
    assert says in str(refused.value)
    assert str(refused.value).startswith(f"position {position}: ")
    assert (refused.value.position, refused.value.token, refused.value.code) == (position, token, "bad_request")


def test_a_very_long_query_is_refused_before_it_is_read():
    with pytest.raises(BadQuery, match="at most 4096"):
        parse_query("num_gpus>=1 " * 400)


def test_every_field_the_language_knows_is_an_offer_field():
    from management.market.offers import Offer

    assert set(FIELDS) <= set(Offer.__struct_fields__)
