"""Softmax cross-entropy over a node mask, averaged over every rank's masked nodes."""

from __future__ import annotations

import math

import numba
import numpy as np

from .backend import on_gpu


def softmax_cross_entropy(logits, y, mask, comm=None):
    """Mean cross-entropy of the masked rows, over all ranks.

    logits [n, C], y int [n], mask bool [n]
    returns (loss, dlogits [n, C], correct, count): correct/count are global counts of the
    masked rows whose argmax equals y.
    """
    if on_gpu(logits):
        from ..kernels.cuda import nn_ops

        grad, local = nn_ops.softmax_ce(logits, y, mask)
    else:
        grad = np.empty_like(logits)
        local = np.zeros(3, np.float64)  # summed -log p, masked rows, right predictions
        _softmax_ce(logits, y, mask, grad, local)
    tot = local if comm is None or comm.size == 1 else comm.allreduce(local)
    count = max(tot[1], 1.0)
    grad *= grad.dtype.type(1.0 / count)
    return float(tot[0] / count), grad, int(tot[2]), int(tot[1])


@numba.njit(cache=True, parallel=True, fastmath=True)
def _softmax_ce(logits, y, mask, grad, out):
    """One pass per row: grad = softmax - onehot on masked rows (0 elsewhere)."""
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


def accuracy(logits, y, mask, comm=None) -> float:
    """Fraction of the masked rows (over all ranks) predicted right."""
    right = ((logits.argmax(1) == y) & mask).sum()
    local = np.array([float(right), float(mask.sum())])
    tot = local if comm is None or comm.size == 1 else comm.allreduce(local)
    return float(tot[0] / tot[1]) if tot[1] else float("nan")
