"""Rank-invariant dropout: whether entry (v, j) survives depends only on (seed, step, the
call's place in the step, global row v, j), never on the number of ranks, so P ranks draw
the masks of one process. Per-edge values are keyed by each edge's global (dst, src):
the edges' ids, and their index tensors, live here too."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InputError
from ..precision import accumulator
from .checks import InputRows, check_edge_values, check_graph, check_rows
from .interop import Op, as_array, as_tensor
from .plan_arrays import PlanArrays


def mask_args(p: float, g, dtype=np.float32):
    """(key, threshold, scale, key_at) of the next mask of g's step, dropping with
    probability p: key_at, a captured step's key slot or None, is where the kernels read
    the key from instead."""
    key, key_at = g.next_dropout_key()
    threshold = np.uint32(min(int(p * 2**32), 2**32 - 1))
    key_at = None if key_at is None else as_array(key_at)
    return key, threshold, np.dtype(dtype).type(1.0 / (1.0 - p)), key_at


class _Dropout(Op):
    @staticmethod
    def forward(ctx, x, g, key, threshold, scale, key_at):
        ctx.nn, ctx.args = g.backend.nn, (key, g.lb, threshold, scale, key_at)
        return as_tensor(ctx.nn.dropout_dense(as_array(x), *ctx.args))

    @staticmethod
    def backward(ctx, dy):
        dx = ctx.nn.dropout_dense(as_array(dy), *ctx.args)  # the same mask
        return as_tensor(dx), None, None, None, None, None


def dropout(x, g, p: float = 0.5, training: bool = True):
    """Zero each entry with probability p and scale the rest by 1/(1-p), in training.

    x: [n, D] tensor, or InputRows: SparseRows (stored entries only; no gradient) or
    ChunkedRows (applied to each chunk as it is used). The masks do not depend on the
    number of ranks (the module's rule)."""
    check_rows(x, g, "dropout")
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    drop = mask_args(p, g, accumulator(x.dtype))
    if isinstance(x, InputRows):
        return x.dropped(drop, g)
    return _Dropout.apply(x, g, *drop)


def edge_dropout(w: torch.Tensor, g, p: float, training: bool = True) -> torch.Tensor:
    """Dropout of per-edge values w [E, H] (GAT's attention), keyed by each edge's global
    (dst, src) and head, so the masks do not depend on the number of ranks."""
    check_graph(g, "edge_dropout")
    check_edge_values(w, g, "edge_dropout", "w")
    if not 0 <= p < 1:
        raise InputError(f"edge_dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return w
    key, threshold, scale, key_at = mask_args(p, g)
    dst, src = edge_ids(g)
    heads = w.shape[1] if w.ndim == 2 else 1
    n = g.plan.num_nodes
    mask = g.backend.nn.edge_dropout(dst, src, heads, n, key, threshold, scale, key_at)
    mask = as_tensor(mask).to(w.dtype)
    return w * (mask if w.ndim == 2 else mask[:, 0])


def edge_ids(g):
    """(dst, src) int64 arrays [E]: global ids of the rank's edges, local then remote."""
    check_graph(g, "edge_ids")
    return PlanArrays.of(g).ids


def edge_index(g, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 tensors [E] over the rank's edges, local then remote: dst is a
    local row in [0, n); src indexes the rows of cat([x, halo(x, g)]) ([n + H, k])."""
    check_graph(g, "edge_index")
    src, dst = (as_tensor(a) for a in PlanArrays.of(g).index)
    return (src, dst) if device is None else (src.to(device), dst.to(device))
