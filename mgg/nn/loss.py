"""Softmax cross-entropy over a node mask, averaged over every rank's masked nodes."""

from __future__ import annotations

import numpy as np

from ..backend import backend_of


def softmax_cross_entropy(logits, y, mask, comm=None):
    """Mean cross-entropy of the masked rows, over all ranks.

    logits [n, C], y int [n], mask bool [n]
    returns (loss, dlogits [n, C], correct, count): correct/count are global counts of the
    masked rows whose argmax equals y.
    """
    # summed -log p, masked rows, right predictions
    grad, local = backend_of(logits).nn.softmax_ce(logits, y, mask)
    tot = local if comm is None or comm.size == 1 else comm.allreduce(local)
    count = max(tot[1], 1.0)
    grad *= grad.dtype.type(1.0 / count)
    return float(tot[0] / count), grad, int(tot[2]), int(tot[1])


def accuracy(logits, y, mask, comm=None) -> float:
    """Fraction of the masked rows (over all ranks) predicted right."""
    right = ((logits.argmax(1) == y) & mask).sum()
    local = np.array([float(right), float(mask.sum())])
    tot = local if comm is None or comm.size == 1 else comm.allreduce(local)
    return float(tot[0] / tot[1]) if tot[1] else float("nan")
