"""numba training kernels: dropout keyed by a hash of (key, global row, column) and a
fused softmax cross-entropy over a node mask. Their CUDA twins are in
mgg/kernels/cuda/nn.cu (the same hash, so a GPU run draws the CPU run's masks)."""

from __future__ import annotations

import math

import numba
import numpy as np

from ..hashing import GOLDEN, mix64


def dropout_dense(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
    """x [n, d] -> the dropped-out copy: entry (i, j) kept (and scaled) where the hash of
    (key, lb + i, j) is at least ``threshold`` (a uint32)."""
    out = np.empty_like(x)
    _dropout_dense(x, out, key, lb, threshold, scale)
    return out


def dropout_csr(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
    """A dropped-out copy of a scipy CSR matrix [n, ncols] (stored entries only)."""
    y = x.copy()
    _dropout_sparse(y.indptr, y.indices, y.data, key, lb, x.shape[1], threshold, scale)
    return y


def softmax_ce(logits, y, mask):
    """(grad [n, C] unscaled, stats float64 [3]: summed -log p, masked rows, right
    predictions) of the masked rows; grad is softmax - onehot there, 0 elsewhere."""
    grad = np.empty_like(logits)
    stats = np.zeros(3, np.float64)
    _softmax_ce(logits, y, mask, grad, stats)
    return grad, stats


@numba.njit(cache=True, inline="always")
def _keep(key, row, col, ncols, threshold):
    z = mix64(key + (np.uint64(row) * np.uint64(ncols) + np.uint64(col) + np.uint64(1)) * GOLDEN)
    return np.uint32(z >> np.uint64(32)) >= threshold


@numba.njit(cache=True, parallel=True)
def _dropout_dense(x, out, key, lb, threshold, scale):
    n, d = x.shape
    for i in numba.prange(n):
        for j in range(d):
            out[i, j] = x[i, j] * scale if _keep(key, lb + i, j, d, threshold) else 0


@numba.njit(cache=True, parallel=True)
def _dropout_sparse(indptr, indices, data, key, lb, ncols, threshold, scale):
    for i in numba.prange(indptr.size - 1):
        for e in range(indptr[i], indptr[i + 1]):
            data[e] = data[e] * scale if _keep(key, lb + i, indices[e], ncols, threshold) else 0


@numba.njit(cache=True, parallel=True, fastmath=True)
def _softmax_ce(logits, y, mask, grad, out):
    n, c = logits.shape
    loss = 0.0
    rows = 0.0
    right = 0.0
    for i in numba.prange(n):
        if not mask[i]:
            for j in range(c):
                grad[i, j] = 0
            continue
        best = 0
        for j in range(1, c):
            if logits[i, j] > logits[i, best]:
                best = j
        top = logits[i, best]
        total = 0.0
        for j in range(c):
            e = math.exp(logits[i, j] - top)
            grad[i, j] = e
            total += e
        inv = 1.0 / total
        for j in range(c):
            grad[i, j] *= inv
        grad[i, y[i]] -= 1
        loss += math.log(total) - (logits[i, y[i]] - top)
        rows += 1.0
        if best == y[i]:
            right += 1.0
    out[0] = loss
    out[1] = rows
    out[2] = right
