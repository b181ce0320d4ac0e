"""The verification challenge's arithmetic, shared by the agent (which answers it) and the Master (which checks it).

A challenge is a sum of seeded matrix products, ``C = sum over r of A_r @ B_r (mod P)``, with ``A_r`` n x k and
``B_r`` k x n. Every entry of every matrix is -1, 0 or 1, derived from the Master's fresh seed by a counter-based
hash (SplitMix64), so a GPU makes its inputs in place (nothing to upload) and the Master makes any one entry in
O(1). Each product's entries are integers of magnitude at most k, exact in FP32 accumulation for k < 2**24 (and
exact as FP16/BF16 inputs), so the answer is one exact integer matrix, whatever card or kernel computed it.

Commit, then open: the host commits to a Merkle root over the rows of C (each row's leaf is the SHA-256 of its
entries as little-endian int64), before it knows which entries the Master will look at. The Master then names a few
rows and columns (its own random picks); the host opens each named row (its entries and the row's authentication
path) and the Master recomputes the named entries from the seed, in O(k * rounds) each, and checks the path against
the root. What this proves and does not prove: docs/verification.md.

Pure: no I/O, no clock. The same code is the simulator's GPU and the Master's check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

P = (1 << 61) - 1  # the answer is reduced mod this Mersenne prime: fits int64, and sums of products stay exact
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
MAX_N = 1 << 14  # largest matrix side the Master asks and the agent accepts
MAX_K = 1 << 16  # largest inner dimension (exact FP32 accumulation needs k < 2**24)
MAX_ROUNDS = 1 << 20


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


def splitmix64(x: int) -> int:
    """SplitMix64's finaliser: a well-mixed 64-bit value from a counter (the GPU kernel computes the same)."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def round_seed(seed: int, r: int, which: int) -> int:
    """The seed of matrix ``which`` (0 for A, 1 for B) of round ``r``."""
    return splitmix64((seed & _MASK) ^ splitmix64((r << 1) | which))


def entry(matrix_seed: int, row: int, col: int, cols: int) -> int:
    """One input entry, -1, 0 or 1 (the top 64 bits' remainder mod 3 is uniform enough: bias below 2**-62)."""
    return splitmix64(matrix_seed ^ (row * cols + col)) % 3 - 1


def answer_entry(seed: int, shape: Shape, i: int, j: int) -> int:
    """C[i, j] recomputed from the seed: what the Master checks an opened row against."""
    total = 0
    for r in range(shape.rounds):
        sa, sb = round_seed(seed, r, 0), round_seed(seed, r, 1)
        total += sum(entry(sa, i, t, shape.k) * entry(sb, t, j, shape.n) for t in range(shape.k))
    return total % P


def answer(seed: int, shape: Shape) -> list[list[int]]:
    """The whole answer, computed on the CPU: the simulator's GPU (small shapes only: O(n * n * k * rounds))."""
    n, k = shape.n, shape.k
    c = [[0] * n for _ in range(n)]
    for r in range(shape.rounds):
        sa, sb = round_seed(seed, r, 0), round_seed(seed, r, 1)
        a = [[entry(sa, i, t, k) for t in range(k)] for i in range(n)]
        b = [[entry(sb, t, j, n) for j in range(n)] for t in range(k)]
        for i in range(n):
            row, ai = c[i], a[i]
            for t in range(k):
                if ai[t]:
                    bt, s = b[t], ai[t]
                    for j in range(n):
                        row[j] += s * bt[j]
    return [[value % P for value in row] for row in c]


# -- the commitment: a Merkle tree over the rows --------------------------------------------------------------------


def row_leaf(row: Sequence[int]) -> bytes:
    return hashlib.sha256(b"".join(int(v).to_bytes(8, "little") for v in row)).digest()


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


def commit(rows: Sequence[Sequence[int]]) -> Commitment:
    levels = _levels([row_leaf(row) for row in rows])
    return Commitment(root=levels[-1][0].hex(), levels=tuple(tuple(level) for level in levels))


def path_matches(root: str, row: int, values: Sequence[int], path: Sequence[str]) -> bool:
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
