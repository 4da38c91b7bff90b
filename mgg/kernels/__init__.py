"""Aggregation: the single entry point ``aggregate`` and its backends."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..partition.plan import PartitionPlan
from ..precision import accumulator
from . import cpu
from .bf16 import store_rows, sums_for
from .cpu import OPS
from .reference import check_edge_weights, check_op

__all__ = ["aggregate", "gather_halo", "OPS"]


def aggregate(
    plan: PartitionPlan,
    x,
    op: str = "sum",
    *,
    halo=None,
    eps: float = 0.0,
    out=None,
    backend: str = "cpu",
    weights=None,
):
    """One rank's aggregation over its local and remote neighbor partitions.

    x     [n_local, D]  this rank's rows (float32, float64, or bf16: summed in float32 and
                        rounded once) (rows lb..ub-1 of the layer input; extra rows of a
                        symmetric allocation are ignored)
    halo  [H, D]        the remote rows in halo order (plan.halo_pe/halo_row), filled by
                        the caller; may be None when the plan has no remote edges
    out   [n_local, D]  optional output buffer
    backend  'cpu' (numba) or 'cuda' (the MGG kernel; numpy or cupy in, cupy out)
    weights  per-call edge weights (local [El(, H)], remote [Er(, H)]) for a weighted sum
    returns out [n_local, D]
    """
    check_op(op, plan.has_weights, weights is not None)
    if backend not in ("cpu", "cuda"):
        raise InputError(f"unknown backend {backend!r}; choose 'cpu' or 'cuda'")
    n = plan.num_local_nodes
    if x.ndim != 2 or x.shape[0] < n:
        raise InputError(
            f"x has shape {x.shape}, expected at least ({n}, D) rows for rank {plan.rank}"
        )
    d = x.shape[1]
    if weights is not None and backend == "cpu":
        weights = check_edge_weights(plan, weights, d, dtype=accumulator(x.dtype))
    if plan.num_remote_edges:
        if halo is None:
            raise InputError(
                f"rank {plan.rank} has {plan.num_remote_edges} remote edges: pass "
                f"the fetched rows as halo [{plan.num_halo}, {d}]"
            )
        if halo.ndim != 2 or halo.shape[0] < plan.num_halo or halo.shape[1] != d:
            raise InputError(f"halo has shape {halo.shape}, expected ({plan.num_halo}, {d})")
    if backend == "cuda":
        from .cuda import aggregate_halo

        return aggregate_halo(plan, x, halo, op, eps, out=out, weights=weights)
    if out is None:
        out = np.empty((n, d), x.dtype)
    elif out.shape != (n, d) or out.dtype != x.dtype:
        raise InputError(f"out is {out.dtype} {out.shape}, expected {x.dtype} ({n}, {d})")
    w = plan.gcn_weights("local") if op == "gcn" else None if weights is None else weights[0]
    if not plan.num_remote_edges:  # every in-edge local: each row summed and stored once
        ptr, node, idx = plan.lnp_ptr, plan.lnp_node, plan.local_indices
        deg, isolated = plan.in_degrees(), plan.num_isolated > 0
        cpu.aggregate_rows(op, ptr, node, idx, w, x, out, eps, deg, isolated)
        return out
    sums = sums_for(out, x.dtype)
    cpu.init_out(op, x, sums, eps)
    cpu.accumulate(
        plan.lnp_ptr, plan.lnp_node, 0, plan.lnp_node.size, plan.local_indices, w, x, sums
    )
    if plan.num_remote_edges:
        w = plan.gcn_weights("remote") if op == "gcn" else None if weights is None else weights[1]
        cpu.accumulate(
            plan.rnp_ptr, plan.rnp_node, 0, plan.rnp_node.size, plan.remote_slot, w, halo, sums
        )
    if op == "mean":
        cpu.finalize(op, plan.in_degrees(), sums)
    store_rows(sums, out)
    return out


def gather_halo(plan: PartitionPlan, x_global: np.ndarray) -> np.ndarray:
    """The halo [H, D] of ``plan`` read from the full input x_global [N, D] (single process)."""
    return x_global[plan.halo_nodes]
