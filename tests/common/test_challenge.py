"""The challenge's arithmetic: the vectorized code (what the Master checks with and the simulator computes) against the
scalar specification, one value at a time; and the exactness a reduced-precision kernel relies on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.challenge import (
    DIGESTS_PER_ROW,
    FORM_ROUNDS,
    FORM_SUM,
    ChallengeShapeError,
    Shape,
    answer_entries,
    answer_entry,
    answer_rows,
    check_form,
    commit,
    digest_rows,
    digests,
    entry,
    matrix,
    path_matches,
    round_digest,
    round_entry,
    round_matrix,
    round_seed,
    splitmix64,
    weight_seed,
    weights,
)

seeds = st.integers(min_value=0, max_value=(1 << 63) - 1)
small_shapes = st.builds(Shape, st.integers(1, 6), st.integers(1, 9), st.integers(1, 3))


def digest_by_definition(seed: int, shape: Shape, r: int) -> int:
    """sum over i, j of W[i, j] * (A_r @ B_r)[i, j] mod 2**64, one scalar at a time."""
    sa, sb, ws = round_seed(seed, r, 0), round_seed(seed, r, 1), weight_seed(seed)
    total = 0
    for i in range(shape.n):
        for j in range(shape.n):
            product = sum(round_entry(sa, i * shape.k + t) * round_entry(sb, j * shape.k + t) for t in range(shape.k))
            total += splitmix64(ws ^ (i * shape.n + j)) * product
    return total % (1 << 64)


@settings(max_examples=40, deadline=None)
@given(seeds, small_shapes)
def test_the_vectorized_sum_is_the_specifications(seed: int, shape: Shape) -> None:
    rows = answer_rows(seed, shape, FORM_SUM)
    cells = [(i, j) for i in range(shape.n) for j in range(shape.n)]
    expected = {(i, j): answer_entry(seed, shape, i, j) for i, j in cells}
    assert {(i, j): int(rows[i][j]) for i, j in cells} == expected
    assert answer_entries(seed, shape, cells) == expected


@settings(max_examples=25, deadline=None)
@given(seeds, small_shapes)
def test_each_rounds_digest_is_the_weighted_sum_of_its_product(seed: int, shape: Shape) -> None:
    values = digests(seed, shape)
    assert [int(v) for v in values] == [digest_by_definition(seed, shape, r) for r in range(shape.rounds)]


def test_the_vectorized_matrices_are_the_specifications_entries() -> None:
    a = matrix(1234, 5, 7)
    assert a.tolist() == [[entry(1234, i, t, 7) for t in range(7)] for i in range(5)]
    b = round_matrix(1234, 5, 7)
    assert b.tolist() == [[round_entry(1234, i * 7 + t) for t in range(7)] for i in range(5)]
    assert {int(v) for v in round_matrix(99, 64, 512).ravel()} == set(range(-128, 128))  # every signed byte


def test_the_rounds_answer_holds_a_row_of_digests_per_1024_rounds() -> None:
    shape = Shape(2, 2, 2 * DIGESTS_PER_ROW + 5)
    values = np.arange(shape.rounds, dtype=np.uint64)
    rows = digest_rows(values, shape)
    assert [len(row) for row in rows] == [DIGESTS_PER_ROW, DIGESTS_PER_ROW, 5]
    assert int(rows[2][0]) == 2 * DIGESTS_PER_ROW


def test_a_fresh_seed_changes_every_rounds_digest() -> None:
    shape = Shape(8, 8, 4)
    assert (digests(1, shape) != digests(2, shape)).all()


def test_one_wrong_entry_of_a_round_changes_its_digest() -> None:
    """The weights are odd or even 64-bit values spread over the whole product: a product off by one entry has
    another digest unless that entry's weight is 0 mod 2**64 (probability 2**-64)."""
    shape, seed = Shape(6, 5, 1), 99
    w = weights(seed, shape.n)
    a = round_matrix(round_seed(seed, 0, 0), shape.n, shape.k).astype(np.int64)
    b = round_matrix(round_seed(seed, 0, 1), shape.n, shape.k).astype(np.int64).T
    product = a @ b
    honest = int((w * product.view(np.uint64)).sum(dtype=np.uint64))
    assert honest == round_digest(seed, shape, 0, w)
    product[2, 3] += 1
    assert int((w * product.view(np.uint64)).sum(dtype=np.uint64)) != honest


def test_reduced_precision_inputs_and_fp32_accumulation_give_the_exact_product() -> None:
    """What a tensor-core kernel computes (FP16 inputs and FP32 accumulation; INT8 with INT32 is exact by construction)
    is the exact integer product, so the Master's check needs no tolerance: the sum form's entries are -1, 0, 1, the
    rounds form's -128..127 with k <= 1024, and every partial sum is an integer within 2**24. (No GPU here: numpy's
    float16 inputs and float32 accumulation stand in for the card's, as documented.)"""
    for a, b in ((matrix(7, 64, 4096), matrix(8, 4096, 64)), (round_matrix(7, 64, 1024), round_matrix(8, 64, 1024).T)):
        exact = a.astype(np.int64) @ b.astype(np.int64)
        half = a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32)
        assert np.array_equal(half.astype(np.int64), exact)
    worst = np.full((1, 1024), -128, dtype=np.float32) @ np.full((1024, 1), -128, dtype=np.float32)
    assert int(worst[0, 0]) == 128 * 128 * 1024 == 2**24


def test_the_rounds_form_refuses_an_inner_dimension_it_cannot_answer_exactly() -> None:
    with pytest.raises(ChallengeShapeError, match="at most 1024"):
        check_form(Shape(64, 2048, 1), FORM_ROUNDS)
    with pytest.raises(ChallengeShapeError, match="unknown challenge form"):
        check_form(Shape(64, 64, 1), "product")
    check_form(Shape(64, 2048, 1), FORM_SUM)


def test_an_opened_digest_row_matches_its_root_and_an_unsigned_overflow_does_not() -> None:
    shape = Shape(3, 3, 9)
    rows = answer_rows(5, shape, FORM_ROUNDS)
    committed = commit(rows)
    assert path_matches(committed.root, 0, [int(v) for v in rows[0]], committed.path(0))
    assert not path_matches(committed.root, 0, [-1] * len(rows[0]), committed.path(0))  # not a 64-bit unsigned value
    assert not path_matches(committed.root, 0, [1 << 64] * len(rows[0]), committed.path(0))
