"""numba kernels that run one rank's LNP/RNP plan on the CPU.

An aggregation is three steps over a rank's output rows ``out`` [n, D]:
``init`` (zeros, or (1+eps)·x for GIN), ``accumulate`` over neighbor partitions, once for
the LNPs reading local rows and once (or batch by batch) for the RNPs reading fetched
rows, and ``finalize`` (divide by the in-degree for mean).
"""

from __future__ import annotations

import numba
import numpy as np

OPS = ("sum", "mean", "gcn", "gin")


def init_out(op: str, x: np.ndarray, out: np.ndarray, eps: float = 0.0) -> None:
    """out [n, D] <- 0, or (1+eps)·x[:n] for GIN."""
    if op == "gin":
        _scale_rows(x, out, np.float32(1.0 + eps))
    else:
        _zero(out)


def finalize(op: str, in_degrees: np.ndarray, out: np.ndarray) -> None:
    """Divide each row by its in-degree for mean (rows of isolated nodes stay 0)."""
    if op == "mean":
        _divide_rows(out, in_degrees)


def accumulate(part_ptr, part_node, k0: int, k1: int, indices, weights, src, out) -> None:
    """out[node[k]] += sum_e w_e · src[indices[e]] for partitions k in [k0, k1).

    part_ptr int64 [K+1], part_node int32 [K]  neighbor partitions (LNP or RNP)
    indices  int [E]    rows of ``src`` (local rows, or halo slots)
    weights  float32 [E] or None
    src      [R, D] rows read;  out [n, D] rows written
    Partitions are spread over threads in edge-balanced chunks; a node whose partitions
    straddle two chunks gets its tail through a per-chunk carry row, so no two threads
    write one row.
    """
    if k1 <= k0 or out.shape[1] == 0:
        return
    nchunks = min(numba.get_num_threads() * 2, k1 - k0)
    e0, e1 = part_ptr[k0], part_ptr[k1]
    cuts = (
        np.searchsorted(
            part_ptr[k0 : k1 + 1], e0 + (e1 - e0) * np.arange(nchunks + 1) // nchunks, side="left"
        ).astype(np.int64)
        + k0
    )
    cuts[0], cuts[-1] = k0, k1
    carry = np.zeros((nchunks, out.shape[1]), out.dtype)
    if weights is None:
        _accumulate(part_ptr, part_node, cuts, indices, src, out, carry)
    else:
        _accumulate_w(part_ptr, part_node, cuts, indices, weights, src, out, carry)
    _add_carry(part_node, cuts, out, carry)


# The hot loops index 2-D arrays element-wise: taking row views (src[u], out[v]) makes numba
# update a shared reference count atomically on every edge, which serializes the threads.
@numba.njit(cache=True, parallel=True, fastmath=True)
def _accumulate(part_ptr, part_node, cuts, indices, src, out, carry):
    d = out.shape[1]
    for c in numba.prange(cuts.size - 1):
        c0, c1 = cuts[c], cuts[c + 1]
        straddle = c > 0 and c0 < c1 and part_node[c0] == part_node[c0 - 1]
        for k in range(c0, c1):
            v = part_node[k]
            if straddle and v == part_node[c0]:
                for e in range(part_ptr[k], part_ptr[k + 1]):
                    u = indices[e]
                    for j in range(d):
                        carry[c, j] += src[u, j]
            else:
                for e in range(part_ptr[k], part_ptr[k + 1]):
                    u = indices[e]
                    for j in range(d):
                        out[v, j] += src[u, j]


@numba.njit(cache=True, parallel=True, fastmath=True)
def _accumulate_w(part_ptr, part_node, cuts, indices, weights, src, out, carry):
    d = out.shape[1]
    for c in numba.prange(cuts.size - 1):
        c0, c1 = cuts[c], cuts[c + 1]
        straddle = c > 0 and c0 < c1 and part_node[c0] == part_node[c0 - 1]
        for k in range(c0, c1):
            v = part_node[k]
            if straddle and v == part_node[c0]:
                for e in range(part_ptr[k], part_ptr[k + 1]):
                    u = indices[e]
                    w = weights[e]
                    for j in range(d):
                        carry[c, j] += w * src[u, j]
            else:
                for e in range(part_ptr[k], part_ptr[k + 1]):
                    u = indices[e]
                    w = weights[e]
                    for j in range(d):
                        out[v, j] += w * src[u, j]


@numba.njit(cache=True)
def _add_carry(part_node, cuts, out, carry):
    for c in range(1, cuts.size - 1):
        c0 = cuts[c]
        if c0 < cuts[c + 1] and part_node[c0] == part_node[c0 - 1]:
            v = part_node[c0]
            for j in range(out.shape[1]):
                out[v, j] += carry[c, j]


@numba.njit(cache=True, parallel=True)
def _zero(out):
    for i in numba.prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = 0


@numba.njit(cache=True, parallel=True)
def _scale_rows(x, out, s):
    for i in numba.prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = s * x[i, j]


@numba.njit(cache=True, parallel=True)
def _divide_rows(out, deg):
    for i in numba.prange(out.shape[0]):
        if deg[i] > 0:
            inv = 1.0 / deg[i]
            for j in range(out.shape[1]):
                out[i, j] *= inv
