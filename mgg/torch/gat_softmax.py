"""GAT's attention over the distributed graph: the softmax of each destination's in-edge
scores in one kernel per direction, no per-edge tensor built by gathering."""

from __future__ import annotations

import torch

from ..errors import InputError
from .aggregation import halo
from .checks import check_rows
from .interop import Op, as_array, as_tensor
from .plan_arrays import PlanArrays


class _Attention(Op):
    @staticmethod
    def forward(ctx, a_all, a_dst, g, slope):
        lp, rp, src, _, _ = PlanArrays.of(g).by_src
        nn = g.backend.nn
        alpha = nn.gat_softmax(lp, rp, src, as_array(a_all), as_array(a_dst), slope)
        ctx.g, ctx.slope = g, slope
        alpha = as_tensor(alpha)
        ctx.save_for_backward(a_all, a_dst, alpha)
        return alpha

    @staticmethod
    def backward(ctx, dalpha):
        g = ctx.g
        a_all, a_dst, alpha = ctx.saved_tensors
        lp, rp, src, ptr, perm = PlanArrays.of(g).by_src
        nn = g.backend.nn
        dscore, da_dst = nn.gat_softmax_backward(
            lp,
            rp,
            src,
            as_array(a_all),
            as_array(a_dst),
            as_array(alpha),
            as_array(dalpha),
            ctx.slope,
        )
        da_all = nn.segment_sum(ptr, perm, dscore, a_all.shape[0])
        return as_tensor(da_all), as_tensor(da_dst), None, None


def attention(a_src: torch.Tensor, a_dst: torch.Tensor, g, negative_slope: float = 0.2):
    """GAT's attention α [E, H] over ``edge_index(g)``'s edges (local then remote): the
    softmax over each destination v's in-edges u -> v of LeakyReLU(a_src[u] + a_dst[v]),
    per head. a_src, a_dst [n, H] (per-node scores of this rank's rows; a_src of remote
    sources comes through ``halo``). One kernel per direction: no per-edge tensor is built
    by gathering. Differentiable in a_src and a_dst."""
    check_rows(a_src, g, "attention")
    check_rows(a_dst, g, "attention")
    if a_src.ndim != 2 or a_src.shape != a_dst.shape or a_src.dtype != a_dst.dtype:
        raise InputError(
            f"attention: a_src and a_dst must be two [n, heads] tensors of one dtype, got "
            f"{tuple(a_src.shape)} {a_src.dtype} and {tuple(a_dst.shape)} {a_dst.dtype}"
        )
    a_all = torch.cat([a_src, halo(a_src, g)])
    return _Attention.apply(a_all, a_dst, g, float(negative_slope))
