"""numba training kernels: dropout keyed by a hash of (key, global row, column), the
same for edges (attention dropout), SDDMM (per-edge, per-head dot products: the
gradient of per-edge weights), GAT's attention softmax over each destination's in-edges
(forward and backward) and a segment sum by source. Their CUDA twins are in
mgg/kernels/cuda/nn.cu (the same hash, so a GPU run draws the CPU run's masks)."""

from __future__ import annotations

import numba
import numpy as np

from ..hashing import GOLDEN, mix64
from ..precision import accumulator, bits
from . import checks as check
from .bf16 import load, put


def _key(key, key_at) -> np.uint64:
    """The mask's key: ``key``, or the one held in the slot ``key_at`` ([1], int64 or
    uint64 bits), as the CUDA twins read a captured step's keys."""
    return np.uint64(key) if key_at is None else np.asarray(key_at).view(np.uint64)[0]


def dropout_dense(x, key: np.uint64, lb: int, threshold: np.uint32, scale, key_at=None):
    """x [n, d] -> the dropped-out copy: entry (i, j) kept (and scaled) where the hash of
    (key, lb + i, j) is at least ``threshold`` (a uint32)."""
    key = _key(key, key_at)
    check.rows2d(x, "dropout_dense", "x")
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    scale = accumulator(x.dtype).type(scale)  # bf16: multiplied in float32, rounded once
    _dropout_dense(bits(x), bits(out), key, lb, threshold, scale)
    return out


def dropout_csr(x, key: np.uint64, lb: int, threshold: np.uint32, scale, key_at=None):
    """A dropped-out copy of a scipy CSR matrix [n, ncols] (stored entries only)."""
    key = _key(key, key_at)
    y = x.copy()
    _dropout_sparse(y.indptr, y.indices, y.data, key, lb, x.shape[1], threshold, scale)
    return y


def edge_dropout(
    dst, src, heads: int, num_nodes: int, key, threshold: np.uint32, scale, key_at=None
):
    """float32 [E, heads]: scale where edge e (src[e] -> dst[e], global ids int64 [E])
    survives in head h, 0 where it is dropped; keyed by (key, dst, src, h), so the mask of
    an edge does not depend on which rank holds it. ``key_at``: a slot holding the key
    (every dropout here takes one), read instead of ``key``."""
    key = _key(key, key_at)
    check.need(
        dst.ndim == 1 and dst.shape == src.shape,
        "edge_dropout",
        lambda: f"dst {dst.shape} and src {src.shape} must be one [E] each",
    )
    out = np.empty((dst.size, heads), np.float32)
    _edge_dropout(dst, src, heads, num_nodes, key, threshold, np.float32(scale), out)
    return out


def sddmm(indptr, indices, a, b, heads: int):
    """[E, heads]: out[e, h] = <a[v, h·C:(h+1)·C], b[indices[e], h·C:(h+1)·C]> for the
    edges e of row v of the CSR (indptr int64 [n+1], indices int [E]); a [n, H·C],
    b [R, H·C] of one float dtype; the output is what it sums in (float32 for bf16)."""
    check.csr_rows(indptr, indices, a, b, heads)
    if a.dtype != b.dtype:
        raise ValueError(f"sddmm takes a and b of one dtype, got {a.dtype} and {b.dtype}")
    out = np.empty((indices.size, heads), accumulator(a.dtype))
    if a.shape[1] % heads:
        raise ValueError(f"{heads} heads do not divide the width {a.shape[1]}")
    a, b = (bits(np.ascontiguousarray(m)) for m in (a, b))
    _sddmm(indptr, indices, a, b, a.shape[1], heads, out)
    return out


def gat_softmax(lp, rp, src, a_all, a_dst, slope: float):
    """[E, H]: α[e, h] = softmax over the in-edges of v of LeakyReLU(a_all[src[e], h] +
    a_dst[v, h]). The edges of row v are lp[v]..lp[v+1] (local) and El + rp[v]..El +
    rp[v+1] (remote), El = lp[n]; lp, rp int64 [n+1], src int64 [E] (rows of a_all);
    a_all [S, H], a_dst [n, H] of one float dtype, which α takes."""
    check.scores(lp, rp, src, a_all, a_dst, "gat_softmax")
    alpha = np.empty((src.size, a_dst.shape[1]), a_dst.dtype)
    _gat_softmax(
        lp, rp, src, np.ascontiguousarray(a_all), np.ascontiguousarray(a_dst), slope, alpha
    )
    return alpha


def gat_softmax_backward(lp, rp, src, a_all, a_dst, alpha, dalpha, slope: float):
    """(dscore [E, H], da_dst [n, H]): the gradient of gat_softmax's scores (through the
    softmax and the LeakyReLU) given dα [E, H], and its sum over each destination's
    edges."""
    check.scores(lp, rp, src, a_all, a_dst, "gat_softmax_backward")
    check.per_edge(alpha, src, a_dst.shape[1], "gat_softmax_backward", "alpha")
    check.per_edge(dalpha, src, a_dst.shape[1], "gat_softmax_backward", "dalpha")
    dscore = np.empty_like(alpha)
    da_dst = np.empty_like(a_dst)
    _gat_softmax_backward(
        lp,
        rp,
        src,
        np.ascontiguousarray(a_all),
        np.ascontiguousarray(a_dst),
        alpha,
        np.ascontiguousarray(dalpha),
        slope,
        dscore,
        da_dst,
    )
    return dscore, da_dst


def segment_sum(ptr, perm, values, segments: int):
    """[segments, H]: out[s] = sum of values[perm[k]] over k in ptr[s]..ptr[s+1], in k's
    order (deterministic); ptr int64 [segments+1], perm int64 [E] (a permutation of
    values' rows), values [E, H]."""
    check.segments(ptr, perm, values, segments)
    out = np.empty((segments, values.shape[1]), values.dtype)
    _segment_sum(ptr, perm, np.ascontiguousarray(values), out)
    return out


@numba.njit(cache=True, inline="always")
def _edge(lp, rp, el, v, t):
    """The t-th in-edge of row v: its local edges, then its remote ones."""
    nl = lp[v + 1] - lp[v]
    return lp[v] + t if t < nl else el + rp[v] + t - nl


@numba.njit(cache=True, inline="always")
def _leaky(x, slope):
    return x if x > 0 else x * slope


# Rows of BLOCK destinations per parallel task, each task with its [H] scratch rows; an
# edge's H heads side by side in the inner loop (its source row read once, not H times:
# heads outermost measured ~2x slower at H = 8). Each (v, h) sums its edges in the
# same order as one head at a time would.
BLOCK = 64


@numba.njit(cache=True, parallel=True)
def _gat_softmax(lp, rp, src, a_all, a_dst, slope, alpha):
    n, heads = a_dst.shape
    el = lp[n]
    for b in numba.prange((n + BLOCK - 1) // BLOCK):
        top = np.empty(heads, np.float64)
        total = np.empty(heads, np.float64)
        for v in range(b * BLOCK, min(n, b * BLOCK + BLOCK)):
            deg = lp[v + 1] - lp[v] + rp[v + 1] - rp[v]
            for h in range(heads):
                top[h], total[h] = -np.inf, 0.0
            for t in range(deg):
                u = src[_edge(lp, rp, el, v, t)]
                for h in range(heads):
                    top[h] = max(top[h], _leaky(a_all[u, h] + a_dst[v, h], slope))
            for t in range(deg):
                e = _edge(lp, rp, el, v, t)
                u = src[e]
                for h in range(heads):
                    x = np.exp(_leaky(a_all[u, h] + a_dst[v, h], slope) - top[h])
                    alpha[e, h] = x
                    total[h] += x
            for t in range(deg):
                e = _edge(lp, rp, el, v, t)
                for h in range(heads):
                    alpha[e, h] = alpha[e, h] / total[h]


@numba.njit(cache=True, parallel=True)
def _gat_softmax_backward(lp, rp, src, a_all, a_dst, alpha, dalpha, slope, dscore, da_dst):
    n, heads = a_dst.shape
    el = lp[n]
    for b in numba.prange((n + BLOCK - 1) // BLOCK):
        dot = np.empty(heads, np.float64)  # sum_e α_e dα_e: d(softmax) = α (dα - dot)
        acc = np.empty(heads, np.float64)
        for v in range(b * BLOCK, min(n, b * BLOCK + BLOCK)):
            deg = lp[v + 1] - lp[v] + rp[v + 1] - rp[v]
            for h in range(heads):
                dot[h], acc[h] = 0.0, 0.0
            for t in range(deg):
                e = _edge(lp, rp, el, v, t)
                for h in range(heads):
                    dot[h] += alpha[e, h] * dalpha[e, h]
            for t in range(deg):
                e = _edge(lp, rp, el, v, t)
                u = src[e]
                for h in range(heads):
                    x = a_all[u, h] + a_dst[v, h]
                    d = alpha[e, h] * (dalpha[e, h] - dot[h]) * (1.0 if x > 0 else slope)
                    dscore[e, h] = d
                    acc[h] += d
            for h in range(heads):
                da_dst[v, h] = acc[h]


@numba.njit(cache=True, parallel=True)
def _segment_sum(ptr, perm, values, out):
    for s in numba.prange(out.shape[0]):  # a row at a time: wide rows stream, H small too
        for h in range(out.shape[1]):
            out[s, h] = 0
        for k in range(ptr[s], ptr[s + 1]):
            e = perm[k]
            for h in range(out.shape[1]):
                out[s, h] += values[e, h]


@numba.njit(cache=True, inline="always")
def _counter(key, row, col, ncols):
    """The counter hashed for entry (row, col) of a [*, ncols] mask; the next column's is
    this + GOLDEN."""
    return key + (np.uint64(row) * np.uint64(ncols) + np.uint64(col) + np.uint64(1)) * GOLDEN


@numba.njit(cache=True, inline="always")
def _kept(z, threshold):
    return np.uint32(mix64(z) >> np.uint64(32)) >= threshold


@numba.njit(cache=True, inline="always")
def _keep(key, row, col, ncols, threshold):
    return _kept(_counter(key, row, col, ncols), threshold)


# Flat arrays and the counter stepped by GOLDEN along the row: the loop vectorizes, 2.4x
# the 2-D loop on amazon_computers' 13752 x 767 features.
@numba.njit(cache=True, parallel=True, fastmath=True)
def _dropout_dense(x, out, key, lb, threshold, scale):
    n, d = x.shape
    xf, of = x.ravel(), out.ravel()
    dd = np.uint64(d)
    zero = scale - scale  # 0 of scale's type
    for i in numba.prange(n):
        base = np.uint64(i) * dd
        z = _counter(key, lb + i, 0, d)
        for j in range(dd):
            keep = _kept(z, threshold)
            put(of, base + j, load(xf, base + j) * (scale if keep else zero))
            z += GOLDEN


@numba.njit(cache=True, parallel=True)
def _dropout_sparse(indptr, indices, data, key, lb, ncols, threshold, scale):
    for i in numba.prange(indptr.size - 1):
        for e in range(indptr[i], indptr[i + 1]):
            data[e] = data[e] * scale if _keep(key, lb + i, indices[e], ncols, threshold) else 0


@numba.njit(cache=True, parallel=True)
def _edge_dropout(dst, src, heads, num_nodes, key, threshold, scale, out):
    for e in numba.prange(dst.size):
        for h in range(heads):
            keep = _keep(key, dst[e], src[e] * heads + h, num_nodes * heads, threshold)
            out[e, h] = scale if keep else 0


@numba.njit(cache=True, parallel=True, fastmath=True)
def _sddmm(indptr, indices, a, b, d, heads, out):
    c = d // heads
    af, bf = a.ravel(), b.ravel()
    for v in numba.prange(indptr.size - 1):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            for h in range(heads):
                acc = 0.0
                for j in range(h * c, h * c + c):
                    acc += load(af, v * d + j) * load(bf, u * d + j)
                out[e, h] = acc
