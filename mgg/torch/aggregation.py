"""Aggregation over the distributed graph as differentiable ops: ``aggregate`` (sum, mean,
GCN's weights, GIN's (1 + ε) x + sum, or per-edge weights), ``halo`` (the peers' rows
this rank's remote edges read), and GCNII's layer in one op (``gcn2``). Every backward
runs over the transposed plan. Each op is collective when the job has several ranks:
every rank calls the same ops in the same order (SPMD)."""

from __future__ import annotations

import torch

from ..errors import InputError
from ..precision import accumulator, is_bf16
from .checks import check_rows, check_tensor, rows_in
from .interop import Op, as_array, as_tensor, like
from .plan_arrays import PlanArrays

OPS = ("sum", "mean", "gcn", "gin")


class _Aggregate(Op):
    @staticmethod
    def eps_stays(eps, x) -> bool:
        """Whether gin's eps stays where it is, on the GPU beside x (reading it would wait
        for the device): the kernel then computes x + sum, and eps x is added after it,
        forward and backward."""
        return eps is not None and eps.is_cuda and eps.device == x.device

    @staticmethod
    def forward(ctx, x, wl, wr, eps, g, op):
        weights = None if wl is None else (as_array(wl), as_array(wr))
        ctx.g, ctx.op, ctx.weighted = g, op, weights is not None
        on_device = _Aggregate.eps_stays(eps, x)
        ctx.eps = float(eps) if eps is not None and not on_device else 0.0
        keep = ctx.weighted or (eps is not None and eps.requires_grad)
        ctx.save_for_backward(x if keep else None, wl, wr, eps if on_device else None)
        out = as_tensor(g.aggregate(as_array(x), op, weights=weights, eps=ctx.eps))
        return out.addcmul_(x, eps) if on_device else out

    @staticmethod
    def backward(ctx, dout):
        g, op = ctx.g, ctx.op
        x, wl, wr, eps = ctx.saved_tensors
        dy = as_array(dout)
        dx = dwl = dwr = deps = None
        acc = accumulator(g.dtype)
        if ctx.needs_input_grad[3]:  # gin: out = (1 + eps) x + sum_u x_u
            deps = row_dot(x, dout)
        if ctx.needs_input_grad[0]:
            if op == "mean":  # out_v = sum_u x_u / deg_v: scale, then the transposed sum
                inv = as_tensor(PlanArrays.of(g).inverse_in_degrees(acc))[:, None]
                dx = g.aggregate(as_array(scaled_rows(dout, inv)), "sum", transpose=True)
            elif ctx.weighted:
                wt = g.edge_transpose(as_array(wl), as_array(wr))
                dx = g.aggregate(dy, "sum", transpose=True, weights=wt)
            else:  # sum, gcn, gin: the same op over the transposed plan
                dx = g.aggregate(dy, op, transpose=True, eps=ctx.eps)
            dx = as_tensor(dx)
            if eps is not None:  # eps_stays: + eps dout
                dx = dx.addcmul_(dout, eps)
        if ctx.weighted and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            dwl, dwr = edge_weight_grads(g, as_array(x), dy, 1 if wl.ndim == 1 else wl.shape[1])
            dwl, dwr = as_tensor(dwl), as_tensor(dwr)
            if wl.ndim == 1:
                dwl, dwr = dwl[:, 0], dwr[:, 0]
        return dx, dwl, dwr, deps, None, None


# bf16 rows with float32 factors or sums take this many float32 bytes of rows at a time:
# torch's CPU ops promote whole operands to float32 first (4x a bf16 copy of the rows)
ROW_BLOCK_BYTES = 256 << 20


def _row_blocks(t: torch.Tensor):
    """(start, end) of t's rows [n, D], a block of ROW_BLOCK_BYTES in float32 at a time."""
    n = t.shape[0]
    step = max(1, ROW_BLOCK_BYTES // (4 * max(t[:1].numel(), 1)))
    return ((s, min(s + step, n)) for s in range(0, n, step))


def scaled_rows(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t [n, D] times scale [n, 1] (float32) in t's dtype: each product in float32, rounded
    once, with no float32 copy of t."""
    if t.dtype == scale.dtype:
        return t * scale
    out = torch.empty_like(t)
    for s, e in _row_blocks(t):
        torch.mul(t[s:e], scale[s:e], out=out[s:e])
    return out


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[1]: the sum of a * b over rows [n, D] in their dtype (bf16 rows: in float32, a
    block at a time)."""
    if a.dtype != torch.bfloat16:
        return (a * b).sum().reshape(1)
    total = torch.zeros(1, dtype=torch.float32, device=a.device)
    for s, e in _row_blocks(a):
        total += (a[s:e].float() * b[s:e].float()).sum()
    return total


def picked(t: torch.Tensor, g) -> torch.Tensor:
    """t [n, D] over the rows of ``g`` -> the rows it computes: t itself, or for a graph
    restricted to some rows (DistGraph.restricted) those rows [L, D]."""
    if g.rows is None:
        return t
    return t.index_select(0, as_tensor(PlanArrays.of(g).rows))


def edge_weight_grads(g, x, dy, heads: int):
    """(local [El, H], remote [Er, H]): d loss / d w_e = <dy_v, x_u> per head, for the
    forward plan's edges u -> v (SDDMM; remote sources from the halo)."""
    lp, li, rp, rs = PlanArrays.of(g).csr
    nn = g.backend.nn
    return nn.sddmm(lp, li, dy, x, heads), nn.sddmm(rp, rs, dy, g.halo.gather(x), heads)


def aggregate(x: torch.Tensor, g, op: str = "sum", weights=None, eps=None) -> torch.Tensor:
    """Aggregate x [n, D] over the in-edges of this rank's nodes; returns [n, D].

    op       'sum', 'mean' (0 for nodes without in-edges), 'gcn' (the plan's weights) or
             'gin': (1 + eps) x + sum (eps a tensor [1] or a float)
    weights  per-edge weights for a weighted sum: a tensor [E] or [E, H] (H heads of D/H
             columns each) over the edges in ``edge_index(g)`` order, local then remote
    Differentiable in x, eps and the weights; the backward runs over the transposed plan.
    x must have the DistGraph's dtype (``g.dtype``: float32 by default; the cpu backend
    also aggregates float64, with ``DistGraph.build(..., dtype=np.float64)``), and the
    weights its accumulator's. In a bfloat16 job (``dtype="bfloat16"``) float32 rows are
    rounded to bf16 on entry (as torch.autocast casts a matmul's input), the output is
    bf16, and the weights are float32; any other dtype is refused, never cast.
    """
    if op not in OPS:
        raise InputError(f"unknown aggregation op {op!r}; choose one of {', '.join(OPS)}")
    x = rows_in(x, g, "aggregate")
    if (op == "gin") != (eps is not None):
        raise InputError("eps goes with op 'gin', and only with it")
    if eps is not None and not isinstance(eps, torch.Tensor):
        eps = torch.tensor([float(eps)])
    if weights is None:
        return _Aggregate.apply(x, None, None, eps, g, op)
    if op != "sum":
        raise InputError(f"edge weights make a weighted sum, not {op!r}")
    if is_bf16(g.dtype) and isinstance(weights, torch.Tensor) and weights.is_floating_point():
        weights = weights.float()  # bf16 rows take float32 weights
    check_tensor(weights, g, "weights", "[E] or [E, H]", (1, 2), accumulator(g.dtype))
    el = g.plan.num_local_edges
    if weights.shape[0] != el + g.plan.num_remote_edges:
        raise InputError(
            f"weights have {weights.shape[0]} rows but rank {g.rank} holds "
            f"{el + g.plan.num_remote_edges} edges"
        )
    return _Aggregate.apply(x, weights[:el], weights[el:], None, g, op)


class _GCN2(Op):
    @staticmethod
    def forward(ctx, x, x0, w, g, op, alpha, beta):
        out = as_tensor(g.aggregate(as_array(x), op)).lerp_(x0, alpha)  # a fresh array
        ctx.save_for_backward(out, w)
        ctx.g, ctx.op, ctx.alpha, ctx.beta = g, op, alpha, beta
        return torch.addmm(out, out, w, beta=1.0 - beta, alpha=beta)

    @staticmethod
    def backward(ctx, dy):
        out, w = ctx.saved_tensors
        a, b, s = ctx.alpha, ctx.beta, (1.0 - ctx.alpha) or 1.0
        # (1-α) d out = (1-α) dy ((1-β) I + β Wᵀ): Â's share scaled in the GEMM, so Âᵀ
        # takes no pass of its own and x₀'s share is one
        dout = torch.addmm(dy, dy, w.t(), beta=(1.0 - b) * s, alpha=b * s)
        dw = torch.mm(out.t(), dy).mul_(b) if ctx.needs_input_grad[2] else None
        dx = dx0 = None
        if ctx.needs_input_grad[0]:
            dx = as_tensor(ctx.g.aggregate(as_array(dout), ctx.op, transpose=True))
            if a == 1:
                dx.zero_()
        if ctx.needs_input_grad[1]:
            dx0 = dout.mul(a / s)
        return dx, dx0, dw, None, None, None, None


def gcn2(x, x0, weight, g, op: str, alpha: float, beta: float) -> torch.Tensor:
    """GCNII's layer (shared weights) in one op: y = out ((1-β) I + β W) with
    out = (1-α) Â x + α x₀, Â the aggregation ``op`` ('gcn' or 'sum'). x, x₀ [n, C],
    W [C, C] -> y [n, C]; differentiable in all three. The backward scales and sums in
    its GEMM: four passes over the rows fewer than aggregate, lerp and addmm under
    autograd (a 64-layer GCNII step on Cora: 1.05-1.12x, A/B in one process)."""
    if op not in ("gcn", "sum"):
        raise InputError(f"gcn2 aggregates with 'gcn' or 'sum', not {op!r}")
    x = rows_in(x, g, "gcn2")
    c = x.shape[1]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (c, c):
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise InputError(f"gcn2: weight must be [{c}, {c}] (x's width), got {got}")
    if not isinstance(x0, torch.Tensor):
        raise InputError(f"gcn2: x0 must be a tensor [{x.shape[0]}, {c}], got {type(x0).__name__}")
    x0 = x0.to(x.dtype)
    if x0.shape != x.shape:
        raise InputError(f"gcn2: x0 is {tuple(x0.shape)}, x {tuple(x.shape)}")
    return _GCN2.apply(x, x0, like(weight, x), g, op, float(alpha), float(beta))


class _Halo(Op):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        a = as_array(x)
        return as_tensor(g.halo.gather(a))

    @staticmethod
    def backward(ctx, dh):
        a = as_array(dh)
        return as_tensor(ctx.g.halo.scatter_add(a)), None


def halo(x: torch.Tensor, g) -> torch.Tensor:
    """x [n, k] -> [H, k]: the rows of peers that this rank's remote edges read, in halo
    order (edge e of the remote CSR reads row remote_slot[e]). Differentiable."""
    check_rows(x, g, "halo")
    check_tensor(x, g, "x", "[n, k]", tuple(range(1, 8)), x.dtype, "halo")
    return _Halo.apply(x, g)
