"""The scipy oracle: what every aggregation design must reproduce."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..graph.core import Graph


def aggregate(
    graph: Graph, x: np.ndarray, op: str = "sum", eps: float = 0.0, rows=None
) -> np.ndarray:
    """Whole-graph aggregation in float64 (only the nodes ``rows`` when given: a cheap
    check of a large graph on a sample).

    x [N, D] -> out [N, D] (or [len(rows), D]) with, for each node v and its in-neighbors
    u (with multiplicity):
      sum   sum_u x_u          mean  sum_u x_u / deg(v)      (0 for isolated v)
      gcn   sum_u w_uv x_u     (edge weights, e.g. from graph.gcn_norm())
      gin   (1 + eps) x_v + sum_u x_u
    """
    check_op(op, graph.weights is not None)
    if x.ndim != 2 or x.shape[0] != graph.num_nodes:
        raise InputError(f"x has shape {x.shape}, expected ({graph.num_nodes}, D)")
    import scipy.sparse as sp

    # built directly: scipy's astype() would merge duplicate edges
    data = graph.weights.astype(np.float64) if op == "gcn" else np.ones(graph.num_edges)
    a = sp.csr_matrix((data, graph.indices, graph.indptr), shape=(graph.num_nodes,) * 2)
    xd = np.asarray(x, np.float64)
    if rows is None:
        rows, out = slice(None), a @ xd
    else:
        rows = np.asarray(rows, np.int64)
        out = a[rows] @ xd
    if op == "mean":
        deg = graph.in_degrees()[rows]
        out[deg > 0] /= deg[deg > 0, None]
    elif op == "gin":  # a block of rows at a time: no [N, D] temporary
        own = xd if isinstance(rows, slice) else xd[rows]
        for a in range(0, len(out), 2**16):
            out[a : a + 2**16] += (1.0 + eps) * own[a : a + 2**16]
    return out


def check_op(op: str, has_weights: bool, edge_weights: bool = False) -> None:
    """``edge_weights``: weights are given with the call (a weighted 'sum')."""
    from .cpu import OPS

    if edge_weights and op != "sum":
        raise InputError(f"edge weights given with the call make a weighted sum, not {op!r}")
    if op not in OPS:
        raise InputError(f"unknown aggregation op {op!r}; choose one of {', '.join(OPS)}")
    if op == "gcn" and not has_weights:
        raise InputError("op 'gcn' needs edge weights: build the plan from graph.gcn_norm()")


def check_edge_weights(plan, weights, dim: int, xp=np, dtype=np.float32):
    """Per-call edge weights (local [El] or [El, H], remote [Er] or [Er, H]) in the plan's
    edge order, as C-contiguous ``dtype`` arrays of module ``xp``; H must divide ``dim``."""
    edge_weight_heads(plan, weights, dim)
    return tuple(xp.ascontiguousarray(xp.asarray(w), dtype=dtype) for w in weights)


def edge_weight_heads(plan, weights, dim: int) -> int:
    """H of per-call edge weights (a pair: local [El(, H)], remote [Er(, H)], in the plan's
    edge order), InputError unless their shapes are that and H divides ``dim``."""
    if not (isinstance(weights, tuple | list) and len(weights) == 2):
        raise InputError("edge weights are a pair (local [El(, H)], remote [Er(, H)])")
    heads = set()
    for name, w, e in (
        ("local", weights[0], plan.num_local_edges),
        ("remote", weights[1], plan.num_remote_edges),
    ):
        if w.ndim not in (1, 2) or w.shape[0] != e:
            raise InputError(
                f"{name} edge weights have shape {tuple(w.shape)}, expected ({e},) or "
                f"({e}, heads) for rank {plan.rank}"
            )
        heads.add(1 if w.ndim == 1 else w.shape[1])
    if len(heads) != 1:
        raise InputError(f"local and remote edge weights have different heads: {heads}")
    (h,) = heads
    if h < 1 or dim % h:
        raise InputError(f"{h} heads do not divide the feature width {dim}")
    return h
