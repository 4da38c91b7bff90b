"""numba training kernels: dropout keyed by a hash of (key, global row, column), the
same for edges (attention dropout), and SDDMM (per-edge, per-head dot products: the
gradient of per-edge weights). Their CUDA twins are in
mgg/kernels/cuda/nn.cu (the same hash, so a GPU run draws the CPU run's masks)."""

from __future__ import annotations

import numba
import numpy as np

from ..hashing import GOLDEN, mix64


def dropout_dense(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
    """x [n, d] -> the dropped-out copy: entry (i, j) kept (and scaled) where the hash of
    (key, lb + i, j) is at least ``threshold`` (a uint32)."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _dropout_dense(x, out, key, lb, threshold, x.dtype.type(scale))
    return out


def dropout_csr(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
    """A dropped-out copy of a scipy CSR matrix [n, ncols] (stored entries only)."""
    y = x.copy()
    _dropout_sparse(y.indptr, y.indices, y.data, key, lb, x.shape[1], threshold, scale)
    return y


def edge_dropout(dst, src, heads: int, num_nodes: int, key, threshold: np.uint32, scale):
    """float32 [E, heads]: scale where edge e (src[e] -> dst[e], global ids int64 [E])
    survives in head h, 0 where it is dropped; keyed by (key, dst, src, h), so the mask of
    an edge does not depend on which rank holds it."""
    out = np.empty((dst.size, heads), np.float32)
    _edge_dropout(dst, src, heads, num_nodes, key, threshold, np.float32(scale), out)
    return out


def sddmm(indptr, indices, a, b, heads: int):
    """[E, heads]: out[e, h] = <a[v, h·C:(h+1)·C], b[indices[e], h·C:(h+1)·C]> for the
    edges e of row v of the CSR (indptr int64 [n+1], indices int [E]); a [n, H·C],
    b [R, H·C] of one float dtype, which the output takes."""
    out = np.empty((indices.size, heads), a.dtype)
    if a.shape[1] % heads:
        raise ValueError(f"{heads} heads do not divide the width {a.shape[1]}")
    _sddmm(indptr, indices, np.ascontiguousarray(a), np.ascontiguousarray(b), heads, out)
    return out


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
            of[base + j] = xf[base + j] * (scale if keep else zero)
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
def _sddmm(indptr, indices, a, b, heads, out):
    c = a.shape[1] // heads
    for v in numba.prange(indptr.size - 1):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            for h in range(heads):
                acc = 0.0
                for j in range(h * c, h * c + c):
                    acc += a[v, j] * b[u, j]
                out[e, h] = acc
