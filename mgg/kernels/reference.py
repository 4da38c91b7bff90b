"""The scipy oracle: what every aggregation design must reproduce."""

from __future__ import annotations

import numpy as np

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
        raise ValueError(f"x has shape {x.shape}, expected ({graph.num_nodes}, D)")
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
    elif op == "gin":
        out += (1.0 + eps) * x[rows]
    return out


def check_op(op: str, has_weights: bool) -> None:
    from .cpu import OPS

    if op not in OPS:
        raise ValueError(f"unknown aggregation op {op!r}; choose one of {', '.join(OPS)}")
    if op == "gcn" and not has_weights:
        raise ValueError("op 'gcn' needs edge weights: build the plan from graph.gcn_norm()")
