"""The verification challenge's arithmetic, shared by the agent (which answers it) and the Master (which checks it).

Every input is a matrix of small integers derived from the Master's fresh seed by a counter-based hash (SplitMix64),
so a GPU makes its inputs in place (nothing to upload) and the Master makes any part of them again. Round ``r``
multiplies ``A_r`` (n x k) by ``B_r`` (k x n). Every product and partial sum is an integer below 2**24 in magnitude,
so FP32 accumulation is exact, and the inputs are exact in the tensor cores' input types: a tensor-core kernel
computes the same integers as an integer one, and the check is exact, with a tolerance of zero.

Two forms (``VerifyChallenge.form``), the same commit-then-open protocol around both:
- ``sum`` (the first form; agents that name no other answer only this one): entries -1, 0 or 1 (exact in FP16, BF16,
  TF32, FP8, INT8 and INT4; k < 2**24); the answer is ``C = sum over r of A_r @ B_r (mod P)``, n rows of n values;
  the Master opens a few rows and recomputes a few entries of each from the seed, O(k * rounds) each. Its cost grows
  with the whole challenge's work, so the work must stay small: on a real card it takes milliseconds and the
  deadline's allowance, not the card's speed, decides.
- ``rounds``: entries are signed bytes, -128 .. 127, the eight bytes of one SplitMix64 value at a time (cheap for a
  GPU to make: its inputs must not cost more than its products), exact in INT8, FP16 and BF16 but not in FP8 or INT4
  (so that no card has an exact path faster than its INT8 or FP16 tensor cores: a ternary input would let a card's
  INT4 or binary tensor cores answer several times faster than the rate its class is judged by); k <= ROUND_MAX_K
  (128**2 * k <= 2**24); ``A_r`` is made row by row and ``B_r`` column by column (each the way its product reads it);
  each round's product is folded into one digest, ``d_r = sum over i, j of W[i, j] * C_r[i, j] (mod
  2**64)``, with ``W`` a seeded matrix of 64-bit weights (dense, so no shortcut computes ``d_r`` for less than the
  product: ``d_r = <A_r^T W, B_r>`` costs the same multiply-adds). The answer is the table of digests,
  ``DIGESTS_PER_ROW`` to a row; the Master opens a few rows and recomputes a few whole rounds of each, O(n * n * k)
  each, however many rounds there are. So the challenge can be sized by the claimed card's speed (millions of
  rounds, tens of seconds) while the Master's check stays a few milliseconds per checked round.

Commit, then open: the host commits to a Merkle root over the rows of its answer (each row's leaf is the SHA-256 of
its values as little-endian unsigned 64-bit integers), before it knows which rows the Master will look at. The Master
then names a few rows (its own random picks); the host opens each named row (its values and the row's authentication
path) and the Master checks the path against the root and recomputes its own picks within the row. What this proves
and does not prove: docs/verification.md.

Pure: no I/O, no clock. The same code is the simulator's GPU and the Master's check (vectorized with numpy; the
scalar ``splitmix64``/``entry``/``answer_entry`` are the specification the vectorized code is tested against).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# One BLAS thread per product: the Master checks in worker threads, several challenges at once, and OpenBLAS's own
# threads spin while they wait: a check of 16 rounds measured 620 ms of CPU with them and 236 ms without, and held up
# an event loop beside it 4x longer (bench/README.md "challenge check"). Before numpy's first import; a setting the
# operator made wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from common.wire import CHALLENGE_FORM_ROUNDS, CHALLENGE_FORM_SUM  # noqa: E402

P = (1 << 61) - 1  # the sum form's answer is reduced mod this Mersenne prime: fits int64, sums of products stay exact
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_WEIGHT_TAG = 1 << 63  # the weights' seed tag: never (r << 1) | which for a round's matrices
MAX_N = 1 << 14  # largest matrix side the Master asks and the agent accepts
MAX_K = 1 << 16  # largest inner dimension (exact FP32 accumulation needs k < 2**24)
MAX_ROUNDS = 1 << 25  # the rounds form sizes rounds by the claimed card's speed: millions on the fastest cards
ROUND_MAX_K = 1024  # 128**2 * k stays within 2**24: FP32 accumulation, on a card or in numpy, is exact

FORM_SUM = CHALLENGE_FORM_SUM
FORM_ROUNDS = CHALLENGE_FORM_ROUNDS
FORMS = (FORM_SUM, FORM_ROUNDS)
DIGESTS_PER_ROW = 1024  # the rounds form's answer: this many rounds' digests to a committed row (8 KiB)

U64 = npt.NDArray[np.uint64]
AnswerRows = Sequence[U64]  # an answer's rows, each a 1-D array of unsigned 64-bit values


class ChallengeShapeError(ValueError):
    """A challenge whose shape an agent must refuse (too large, or not positive)."""


@dataclass(frozen=True)
class Shape:
    """What a challenge asks: ``rounds`` products of an n x k and a k x n matrix."""

    n: int
    k: int
    rounds: int

    def __post_init__(self) -> None:
        for name, value, limit in (("n", self.n, MAX_N), ("k", self.k, MAX_K), ("rounds", self.rounds, MAX_ROUNDS)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                raise ChallengeShapeError(f"challenge {name} must be an integer in [1, {limit}], got {value!r}")

    @property
    def flops(self) -> float:
        """Multiply-adds counted as two operations, as TFLOP/s figures count them."""
        return 2.0 * self.n * self.n * self.k * self.rounds


def check_form(shape: Shape, form: str) -> None:
    """ChallengeShapeError for a form this code does not know, or a shape the form cannot answer exactly."""
    if form not in FORMS:
        raise ChallengeShapeError(f"unknown challenge form {form!r}; known: {', '.join(FORMS)}")
    if form == FORM_ROUNDS and shape.k > ROUND_MAX_K:
        raise ChallengeShapeError(f"the rounds form's k must be at most {ROUND_MAX_K}, got {shape.k}")


# -- the specification: scalar, one value at a time ----------------------------------------------------------------


def splitmix64(x: int) -> int:
    """SplitMix64's finaliser: a well-mixed 64-bit value from a counter (the GPU kernel computes the same)."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def round_seed(seed: int, r: int, which: int) -> int:
    """The seed of matrix ``which`` (0 for A, 1 for B) of round ``r``."""
    return splitmix64((seed & _MASK) ^ splitmix64((r << 1) | which))


def weight_seed(seed: int) -> int:
    """The seed of the rounds form's weights ``W``."""
    return splitmix64((seed & _MASK) ^ splitmix64(_WEIGHT_TAG))


def entry(matrix_seed: int, row: int, col: int, cols: int) -> int:
    """One input entry of the sum form, -1, 0 or 1 (the remainder mod 3 of 64 bits is uniform enough: bias < 2**-62)."""
    return splitmix64(matrix_seed ^ (row * cols + col)) % 3 - 1


def round_entry(matrix_seed: int, position: int) -> int:
    """The rounds form's input entry at flat ``position`` (A_r: row * k + t; B_r: column * k + t): byte
    ``position % 8`` (little-endian) of ``splitmix64(matrix_seed ^ (position // 8))``, as a signed byte."""
    byte = (splitmix64(matrix_seed ^ (position >> 3)) >> (8 * (position & 7))) & 0xFF
    return byte - 256 if byte >= 128 else byte


def answer_entry(seed: int, shape: Shape, i: int, j: int) -> int:
    """C[i, j] of the sum form, recomputed from the seed one term at a time (the specification of answer_entries)."""
    total = 0
    for r in range(shape.rounds):
        sa, sb = round_seed(seed, r, 0), round_seed(seed, r, 1)
        total += sum(entry(sa, i, t, shape.k) * entry(sb, t, j, shape.n) for t in range(shape.k))
    return total % P


# -- vectorized: what the Master checks with and the simulator computes ---------------------------------------------

_G, _M1, _M2 = np.uint64(_GOLDEN), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _THREE = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(3)
_CHUNK = 1 << 20  # values generated at once: a few MiB of temporaries


def splitmix64_array(x: U64) -> U64:
    """``splitmix64`` of every value (uint64 arithmetic wraps, as the scalar's masks do)."""
    x = x + _G
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def round_seeds(seed: int, rounds: U64, which: int) -> U64:
    """``round_seed`` of each round in ``rounds``."""
    tags = splitmix64_array((rounds << np.uint64(1)) | np.uint64(which))
    return splitmix64_array(np.uint64(seed & _MASK) ^ tags)


def entries(matrix_seeds: U64 | int, index: U64) -> npt.NDArray[np.int8]:
    """Input entries (-1, 0, 1) at flat positions ``index`` (row * cols + col) of the matrices ``matrix_seeds``
    (broadcast against ``index``)."""
    mixed = splitmix64_array(np.asarray(matrix_seeds, dtype=np.uint64) ^ index)
    return (mixed % _THREE).astype(np.int8) - np.int8(1)


def matrix(matrix_seed: int, rows: int, cols: int) -> npt.NDArray[np.int8]:
    """A whole input matrix of the sum form."""
    return entries(matrix_seed, np.arange(rows * cols, dtype=np.uint64)).reshape(rows, cols)


def round_matrix(matrix_seed: int, rows: int, cols: int) -> npt.NDArray[np.int8]:
    """``rows`` x ``cols`` entries of the rounds form laid out row by row (``round_entry`` of row * cols + col): A_r
    as it is (n x k), B_r transposed (its n columns, each of k entries)."""
    words = splitmix64_array(np.uint64(matrix_seed) ^ np.arange(-(-rows * cols // 8), dtype=np.uint64))
    return words.astype("<u8").view(np.int8)[: rows * cols].reshape(rows, cols)


def answer_entries(seed: int, shape: Shape, cells: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """C[i, j] of the sum form for each cell: the rows of A and columns of B the cells need, made for every round a
    chunk at a time, and multiplied exactly (each round's product is an integer of magnitude at most k)."""
    wanted = list(dict.fromkeys(cells))
    rows = sorted({i for i, _ in wanted})
    cols = sorted({j for _, j in wanted})
    n, k = shape.n, shape.k
    t = np.arange(k, dtype=np.uint64)
    a_index = np.asarray(rows, dtype=np.uint64)[:, None] * np.uint64(k) + t  # (rows, k)
    b_index = t[:, None] * np.uint64(n) + np.asarray(cols, dtype=np.uint64)  # (k, cols)
    total = np.zeros((len(rows), len(cols)), dtype=np.int64)
    chunk = max(1, _CHUNK // (k * max(len(rows), len(cols))))
    for first in range(0, shape.rounds, chunk):
        rs = np.arange(first, min(shape.rounds, first + chunk), dtype=np.uint64)
        a = entries(round_seeds(seed, rs, 0)[:, None, None], a_index).astype(np.float64)
        b = entries(round_seeds(seed, rs, 1)[:, None, None], b_index).astype(np.float64)
        total += np.rint(np.matmul(a, b).sum(axis=0)).astype(np.int64)  # |sum| <= k * chunk < 2**53: exact
    return {(i, j): int(total[rows.index(i), cols.index(j)]) % P for i, j in wanted}


def answer(seed: int, shape: Shape) -> U64:
    """The sum form's whole answer, n x n (the simulator's GPU: small shapes only, O(n * n * k * rounds))."""
    total = np.zeros((shape.n, shape.n), dtype=np.int64)
    for r in range(shape.rounds):
        a = matrix(round_seed(seed, r, 0), shape.n, shape.k).astype(np.float64)
        b = matrix(round_seed(seed, r, 1), shape.k, shape.n).astype(np.float64)
        total += np.rint(a @ b).astype(np.int64)
    return np.mod(total, P).astype(np.uint64)


def weights(seed: int, n: int) -> U64:
    """The rounds form's n x n weights ``W``."""
    return splitmix64_array(np.uint64(weight_seed(seed)) ^ np.arange(n * n, dtype=np.uint64)).reshape(n, n)


def round_digest(seed: int, shape: Shape, r: int, w: U64) -> int:
    """Round ``r``'s digest, ``sum of W * (A_r @ B_r) mod 2**64`` (the product's entries as two's complement)."""
    if shape.k > ROUND_MAX_K:
        raise ChallengeShapeError(f"the rounds form's k must be at most {ROUND_MAX_K}, got {shape.k}")
    a = round_matrix(round_seed(seed, r, 0), shape.n, shape.k).astype(np.float32)
    b = round_matrix(round_seed(seed, r, 1), shape.n, shape.k).astype(np.float32).T  # made column by column
    product = np.rint(a @ b).astype(np.int64).view(np.uint64)  # |entry| <= 128**2 * k <= 2**24: exact in FP32
    return int((w * product).sum(dtype=np.uint64))


def digests(seed: int, shape: Shape) -> U64:
    """Every round's digest (the simulator's GPU: small shapes only)."""
    w = weights(seed, shape.n)
    return np.fromiter((round_digest(seed, shape, r, w) for r in range(shape.rounds)), dtype=np.uint64, count=shape.rounds)


def digest_width(shape: Shape) -> int:
    """Digests per committed row of the rounds form's answer (the last row may be shorter)."""
    return min(shape.rounds, DIGESTS_PER_ROW)


def digest_rows(values: U64, shape: Shape) -> list[U64]:
    """The rounds form's answer: its digests, ``digest_width`` to a row."""
    width = digest_width(shape)
    return [values[start : start + width] for start in range(0, shape.rounds, width)]


def answer_rows(seed: int, shape: Shape, form: str) -> list[U64]:
    """The whole answer of ``form`` computed on the CPU, as the rows the host commits to (small shapes only)."""
    if form == FORM_ROUNDS:
        return digest_rows(digests(seed, shape), shape)
    if form == FORM_SUM:
        return list(answer(seed, shape))
    raise ChallengeShapeError(f"unknown challenge form {form!r}; known: {', '.join(FORMS)}")


# -- the commitment: a Merkle tree over the rows --------------------------------------------------------------------


def row_leaf(row: Sequence[int] | U64) -> bytes:
    """SHA-256 of the row as little-endian unsigned 64-bit integers. OverflowError for a value outside [0, 2**64)."""
    return hashlib.sha256(np.asarray(row, dtype="<u8").tobytes()).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _levels(leaves: list[bytes]) -> list[list[bytes]]:
    levels = [leaves]
    while len(levels[-1]) > 1:
        level = levels[-1]
        if len(level) % 2:
            level = [*level, level[-1]]  # an odd node pairs with itself
        levels.append([_node(level[i], level[i + 1]) for i in range(0, len(level), 2)])
    return levels


@dataclass(frozen=True)
class Commitment:
    """The host's side: the root it sends first, and the paths it opens rows with afterwards."""

    root: str
    levels: tuple[tuple[bytes, ...], ...]

    def path(self, row: int) -> list[str]:
        """The sibling hashes from the row's leaf up to the root, hex."""
        path, index = [], row
        for level in self.levels[:-1]:
            sibling = index ^ 1
            path.append((level[sibling] if sibling < len(level) else level[index]).hex())
            index //= 2
        return path


def commit(rows: Sequence[Sequence[int]] | AnswerRows | U64) -> Commitment:
    levels = _levels([row_leaf(row) for row in rows])
    return Commitment(root=levels[-1][0].hex(), levels=tuple(tuple(level) for level in levels))


def path_matches(root: str, row: int, values: Sequence[int] | U64, path: Sequence[str]) -> bool:
    """Whether ``values`` are row ``row`` of the matrix ``root`` commits to. Never raises on malformed hex."""
    try:
        node = row_leaf(values)
        index = row
        for sibling_hex in path:
            sibling = bytes.fromhex(sibling_hex)
            node = _node(node, sibling) if index % 2 == 0 else _node(sibling, node)
            index //= 2
    except (ValueError, OverflowError):
        return False
    return index == 0 and node.hex() == root
