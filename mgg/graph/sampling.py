"""The numba kernels of papers100m (mgg.graph.papers): every node's class and weight from
a hash of its id, the nodes in class order, the guide to the weights' prefix sums, the
draws, and the features, float32 or bfloat16. Each is parallel, and each value depends
on its counters alone, not on the threads.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..hashing import GOLDEN, mix64
from .generators import uniform_of

_ROW_BLOCK = 256  # feature rows per task
_DRAW_BLOCK = 4096  # draws per task
_GROUP = 16  # draws whose loads are issued together
_LO32 = np.uint64(0xFFFFFFFF)


@numba.njit(parallel=True, cache=True)
def classes_of(ids, key, classes, out):
    for i in numba.prange(ids.size):
        out[i] = np.int64(mix64(key + np.uint64(ids[i]) * GOLDEN) % np.uint64(classes))


@numba.njit(parallel=True, cache=True)
def classes_of_range(key, classes, out):
    """out[i] = the class of node i (as classes_of), for i in 0..len(out)-1."""
    for i in numba.prange(out.size):
        out[i] = mix64(key + np.uint64(i) * GOLDEN) % np.uint64(classes)


def class_blocks(n: int) -> np.ndarray:
    """int64 [B+1]: node ids in blocks, four per thread."""
    parts = max(1, min(4 * numba.get_num_threads(), n))
    return np.linspace(0, n, parts + 1).astype(np.int64)


@numba.njit(parallel=True, cache=True)
def class_order(y, classes, blocks, order, starts):
    """order: the nodes sorted by class, stably (argsort(y, kind="stable")), a counting
    sort over blocks of node ids; starts [C+1]: each class's first position."""
    nb = blocks.size - 1
    counts = np.zeros((nb, classes), np.int64)
    for b in numba.prange(nb):
        for i in range(blocks[b], blocks[b + 1]):
            counts[b, y[i]] += 1
    acc = 0
    for c in range(classes):
        starts[c] = acc
        for b in range(nb):
            k = counts[b, c]
            counts[b, c] = acc
            acc += k
    starts[classes] = acc
    for b in numba.prange(nb):
        pos = counts[b]
        for i in range(blocks[b], blocks[b + 1]):
            c = y[i]
            order[pos[c]] = i
            pos[c] += 1


@numba.njit(parallel=True, cache=True)
def gather_rows(values, order, out):
    for i in numba.prange(out.size):
        out[i] = values[order[i]]


@numba.njit(cache=True, inline="always")
def _bucket(p, scale, k):
    """The guide's bucket of weight p >= 0: monotone in p, so a bucket holds a range."""
    return max(min(np.int64(p * scale), k - 1), 0)


@numba.njit(parallel=True, cache=True)
def guide_table(cum, scale, guide):
    """guide[b] = #{i: _bucket(cum[i]) < b} for b in 0..K: the buckets from the one of
    cum[i-1] (exclusive) to the one of cum[i] start at i."""
    n, k = cum.size, guide.size - 1
    for i in numba.prange(n + 1):
        lo = -1 if i == 0 else _bucket(cum[i - 1], scale, k)
        hi = k if i == n else _bucket(cum[i], scale, k)
        for b in range(lo + 1, hi + 1):
            guide[b] = i


@numba.njit(cache=True, inline="always")
def _walk(cum, j, end, p):
    """From the first position of p's bucket (j) to its end: np.searchsorted(cum, p,
    side="right"), exactly (a bucket holds few positions: every node weighs >= 1; cum is
    not read at all for a bucket within one node's weight)."""
    while j < end and cum[j] <= p:
        j += 1
    return j


@numba.njit(cache=True, inline="always")
def _class_at(starts, i, per_position):
    """The class of position i (starts[c] <= i < starts[c + 1]): classes are about equal,
    so the guess i C / N (per_position = C / N: a product, no integer division) is off by
    a step or two at most."""
    nc = starts.size - 1
    c = min(np.int64(i * per_position), nc - 1)
    while starts[c] > i:
        c -= 1
    while starts[c + 1] <= i:
        c += 1
    return c


@numba.njit(parallel=True, cache=True)
def draw_edges(src, dst, key, t_in, cum, order, starts, mass_lo, mass, guide, scale, e0):
    """Draws e0.. into (src, dst): planted_partition's stream (generators._planted_fill),
    each search through the guide; in groups of _GROUP draws, each step's loads for the
    whole group issued together, so that their cache misses overlap."""
    n = cum.size
    total = cum[n - 1]
    k = guide.size - 1
    per_position = (starts.size - 1) / n
    for blk in numba.prange((src.size + _DRAW_BLOCK - 1) // _DRAW_BLOCK):
        r1 = np.empty(_GROUP, np.uint64)
        r2, p = np.empty(_GROUP, np.float64), np.empty(_GROUP, np.float64)
        j, end = np.empty(_GROUP, np.int64), np.empty(_GROUP, np.int64)
        u, lo, hi = (
            np.empty(_GROUP, np.int64),
            np.empty(_GROUP, np.int64),
            np.empty(_GROUP, np.int64),
        )
        first = blk * _DRAW_BLOCK
        last = min(src.size, first + _DRAW_BLOCK)
        for g in range(first, last, _GROUP):
            m = min(_GROUP, last - g)
            for q in range(m):  # the hashes, u's bucket
                base = np.uint64(e0 + g + q) * np.uint64(3)
                p[q] = uniform_of(mix64(key + base * GOLDEN)) * total
                r1[q] = mix64(key + (base + np.uint64(1)) * GOLDEN)
                r2[q] = uniform_of(mix64(key + (base + np.uint64(2)) * GOLDEN))
                b = _bucket(p[q], scale, k)
                j[q], end[q] = guide[b], guide[b + 1]
            for q in range(m):  # u's position and class, v's weight and bucket
                i = min(_walk(cum, j[q], end[q], p[q]), n - 1)
                u[q] = i
                c = _class_at(starts, i, per_position)
                if (r1[q] & _LO32) < t_in:
                    lo[q], hi[q] = starts[c], starts[c + 1] - 1
                    p[q] = mass_lo[c] + r2[q] * mass[c]
                else:
                    lo[q], hi[q] = 0, n - 1
                    p[q] = r2[q] * (total - mass[c])
                    if p[q] >= mass_lo[c]:
                        p[q] += mass[c]
                b = _bucket(p[q], scale, k)
                j[q], end[q] = guide[b], guide[b + 1]
            for q in range(m):  # v's position, both nodes
                v = _walk(cum, j[q], end[q], p[q])
                src[g + q] = order[u[q]]
                dst[g + q] = order[min(max(v, lo[q]), hi[q])]


@numba.njit(parallel=True, cache=True)
def draw_weights(key, out):
    """Pareto weights of tail exponent 1.5 (degrees of exponent 2.5), node i's from a hash
    of i."""
    for i in numba.prange(out.size):
        u = uniform_of(mix64(key + np.uint64(i) * GOLDEN))
        out[i] = (1.0 - u) ** (-1.0 / 1.5)


@numba.njit(cache=True, inline="always")
def _feature(key, base, j, c, cent, noise):
    """float32: feature j of the node whose counters start at ``base``, of class c."""
    h = mix64(key + (base + np.uint64(j)) * GOLDEN)
    u1 = (np.float64(h >> np.uint64(32)) + 0.5) * (1.0 / 4294967296.0)
    u2 = (np.float64(h & _LO32) + 0.5) * (1.0 / 4294967296.0)
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return cent[c, j] + noise * np.float32(z)


@numba.njit(parallel=True, cache=True)
def draw_features(ids, y, cent, noise, key, out, bf16):
    """Rows of x into out: float32 [n, F], or (bf16) uint16 [n, F], bfloat16's words of
    the float32 values rounded to nearest even."""
    f = out.shape[1]
    blocks = (ids.size + _ROW_BLOCK - 1) // _ROW_BLOCK
    for blk in numba.prange(blocks):
        row = np.empty(f, np.float32)
        words = row.view(np.uint32)
        for i in range(blk * _ROW_BLOCK, min(ids.size, (blk + 1) * _ROW_BLOCK)):
            base = np.uint64(ids[i]) * np.uint64(f)
            for j in range(f):
                row[j] = _feature(key, base, j, y[i], cent, noise)
            for j in range(f):
                out[i, j] = _to_bf16(words[j]) if bf16 else row[j]


@numba.njit(cache=True, inline="always")
def _to_bf16(w):
    """bfloat16's word of the float32 of word w (finite), rounded to nearest even."""
    return (w + np.uint32(0x7FFF) + ((w >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
