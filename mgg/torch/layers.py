"""Layers with PyG's signatures over the distributed graph.

A layer's ``forward(x, g)`` takes this rank's rows x [n, in] (a tensor, or SparseRows for
sparse input features) and the job's DistGraph g, and returns [n, out]. Autograd does the
rest: each aggregation's backward runs over the transposed plan. Parameter names follow
PyG, so ``layer.load_state_dict(pyg_layer.state_dict())`` works.

Writing a new layer: subclass torch.nn.Module with ``forward(x, g)`` (first
``check_graph(g, name)``, as every layer here, so a wrong ``g`` is named); move rows with
``linear`` (dense or sparse input), aggregate them with ``aggregate(x, g, op)`` (op 'sum',
'mean', 'gcn') or with per-edge weights ``aggregate(x, g, weights=w)`` (w [E] or [E, H]
over ``edge_index(g)``), reach neighbors' per-node values with ``halo``, reduce across
ranks with ``all_reduce``; set ``graph`` to the graph the layer expects ('gcn_norm',
'self_loops', 'no_self_loops' or 'as_is'); register a model using it in
mgg.torch.models.MODELS for the CLI.
"""

from __future__ import annotations

import contextlib
import math
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from .ops import (
    SparseRows,
    aggregate,
    all_reduce,
    attention,
    check_graph,
    check_rows,
    edge_dropout,
    like,
)
from .ops import linear as _linear


def _glorot(t: torch.Tensor) -> None:
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


_pyg_order = False  # inside pyg_widths()


@contextlib.contextmanager
def pyg_widths():
    """Inside, each layer aggregates at the width its PyG twin does (GCN after its Linear,
    SAGE and GIN before it) instead of the narrower one: the same function, computed in
    PyG's order, so a benchmark can tell mgg's algebra from its kernels."""
    global _pyg_order
    old, _pyg_order = _pyg_order, True
    try:
        yield
    finally:
        _pyg_order = old


def _narrower(x, out_dim: int, pyg: bool) -> bool:
    """Transform before aggregating: x is sparse; else, inside ``pyg_widths``, PyG's order
    ``pyg``; else the output is narrower."""
    if isinstance(x, SparseRows):
        return True
    return pyg if _pyg_order else out_dim < x.shape[1]


class GCNConv(nn.Module):
    """Kipf & Welling: y = Â x Wᵀ + b, Â = D^-1/2 (A+I) D^-1/2 (the plan's 'gcn' weights).
    x [n, in] -> y [n, out]; W [out, in] (``lin.weight``), b [out].

    Aggregates at the smaller width: Â(x Wᵀ) when out < in (or x is sparse), else
    (Â x) Wᵀ; autograd's backward mirrors the order.
    """

    graph = "gcn_norm"

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x, g) -> torch.Tensor:
        check_graph(g, "GCNConv")
        if _narrower(x, self.out_channels, pyg=True):
            y = aggregate(_linear(x, self.lin.weight), g, "gcn")
        else:
            y = _linear(aggregate(x, g, "gcn"), self.lin.weight)
        return y if self.bias is None else y + like(self.bias, y)


class SAGEConv(nn.Module):
    """Hamilton et al. (mean): y_v = W_l · mean_{u→v} x_u + b + W_r x_v.
    x [n, in] -> y [n, out]; ``lin_l`` (W_l, b) and ``lin_r`` (W_r) [out, in].
    Aggregates at the smaller width, as GCNConv."""

    graph = "as_is"

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        aggr: str = "mean",
        root_weight: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        if aggr not in ("mean", "sum"):
            raise ValueError(f"SAGEConv aggregates by 'mean' or 'sum', not {aggr!r}")
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, aggr
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_l, self.lin_r):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x, g) -> torch.Tensor:
        check_graph(g, "SAGEConv")
        w, b = self.lin_l.weight, self.lin_l.bias
        if _narrower(x, self.out_channels, pyg=False):
            y = aggregate(_linear(x, w), g, self.aggr)
            y = y if b is None else y + like(b, y)
        else:
            y = _linear(aggregate(x, g, self.aggr), w, b)
        if self.lin_r is not None:
            y = y + _linear(x, self.lin_r.weight).to(y.dtype)
        return y


class BatchNorm(nn.Module):
    """Batch normalization over every rank's rows: y = (x - μ) / sqrt(σ² + eps) · γ + β,
    with μ, σ² reduced across ranks, so P ranks compute what one process does.
    x [n, C] -> [n, C] (x's dtype; the statistics in float32 for bf16 x); the parameters
    and buffers of torch.nn.BatchNorm1d."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, g) -> torch.Tensor:
        check_graph(g, "BatchNorm")
        rows, x = x, x.float() if x.dtype == torch.bfloat16 else x
        if not self.training:
            mean, var = self.running_mean, self.running_var
        else:
            check_rows(x, g, "BatchNorm")  # this rank's rows: the plan counts all ranks'
            count = g.plan.num_nodes
            if count < 2:
                raise ValueError(f"batch normalization needs at least 2 rows, got {count}")
            mean = all_reduce(x.sum(0), g) / count
            var = all_reduce(((x - mean) ** 2).sum(0), g) / count
            with torch.no_grad():
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))
                self.num_batches_tracked += 1
        y = (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return y.to(rows.dtype)


class MLP(nn.Module):
    """Linear -> [BatchNorm] -> ReLU -> ... -> Linear over ``channels`` [in, ..., out]
    (GIN's MLP). forward(x, g): g reduces the batch statistics across ranks."""

    def __init__(self, channels: list[int], batch_norm: bool = True):
        super().__init__()
        if len(channels) < 2:
            raise ValueError(f"an MLP needs at least [in, out] channels, got {channels}")
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(channels))
        self.norms = nn.ModuleList(
            BatchNorm(c) if batch_norm else nn.Identity() for c in channels[1:-1]
        )

    def forward(self, x, g, first_done: bool = False) -> torch.Tensor:
        """``first_done``: x already went through the first Linear (GINConv's order)."""
        check_graph(g, "MLP")
        for i, lin in enumerate(self.lins):
            if i > 0 or not first_done:
                x = _linear(x, lin.weight, lin.bias)
            if i < len(self.norms):
                norm = self.norms[i]
                x = F.relu(norm(x, g) if isinstance(norm, BatchNorm) else x)
        return x


class GINConv(nn.Module):
    """Xu et al.: y_v = MLP((1 + ε) x_v + sum_{u→v} x_u).  x [n, in] -> [n, out].

    ``nn``: an mgg.torch.MLP (batch statistics over all ranks) or any module of x whose
    first layer, if a torch.nn.Linear narrower than in, is applied before aggregating
    (it commutes with the sum). ε is a parameter when ``train_eps``.
    """

    graph = "no_self_loops"

    def __init__(self, nn: nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.tensor([eps]))
        else:
            self.register_buffer("eps", torch.tensor([eps]))

    def reset_parameters(self) -> None:
        self.eps.data.fill_(self.initial_eps)

    def _first_linear(self):
        if isinstance(self.nn, MLP):
            return self.nn.lins[0]
        if isinstance(self.nn, torch.nn.Sequential) and isinstance(self.nn[0], nn.Linear):
            return self.nn[0]
        return None

    def forward(self, x, g) -> torch.Tensor:
        check_graph(g, "GINConv")
        if g.size > 1 and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.nn.modules()
        ):
            raise ValueError(
                "torch's BatchNorm normalizes each rank's rows alone: use mgg.torch.MLP or "
                "mgg.torch.BatchNorm, whose statistics cover every rank"
            )
        first = self._first_linear()
        narrow = first is not None and _narrower(x, first.out_features, pyg=False)
        if narrow:
            x = _linear(x, first.weight)
        elif isinstance(x, SparseRows):
            raise ValueError("GINConv on sparse features needs an nn starting with a Linear")
        h = aggregate(x, g, "gin", eps=self.eps)  # (1 + eps) x + sum, in one kernel
        if narrow and first.bias is not None:
            h = h + like(first.bias, h)
        if isinstance(self.nn, MLP):
            return self.nn(h, g, first_done=narrow)
        if narrow:
            return self.nn[1:](h)
        return self.nn(h)


def edge_softmax(e: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    """Softmax of per-edge scores e [E, H] over the in-edges of each destination
    (dst [E] rows in [0, n)); all of a node's in-edges are on its rank. Deterministic:
    no scatter with atomics, forward or backward."""
    idx = dst.unsqueeze(1).expand_as(e)
    top = torch.full((n, e.shape[1]), float("-inf"), dtype=e.dtype, device=e.device)
    top = top.scatter_reduce(0, idx, e.detach(), "amax", include_self=True)
    ex = (e - top.index_select(0, dst)).exp()
    total = torch.zeros((n, e.shape[1]), dtype=e.dtype, device=e.device).index_add_(0, dst, ex)
    return ex / (total.index_select(0, dst) + 1e-16)


class GATConv(nn.Module):
    """Veličković et al.: y_v = ‖_h sum_{u→v} α^h_uv W^h x_u + b, with
    α^h_uv = softmax_u(LeakyReLU(a^h_src · W^h x_u + a^h_dst · W^h x_v)) over v's in-edges
    (self loops included). x [n, in] -> [n, heads·out] (concat) or [n, out] (mean of the
    heads); ``lin.weight`` [heads·out, in], ``att_src``/``att_dst`` [1, heads, out].

    Only the per-node scores a_src of remote sources and their rows W x_u cross ranks;
    the softmax of a node's in-edges runs on its rank; ``dropout`` drops attention
    coefficients (rank-invariant masks).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.graph = "self_loops" if add_self_loops else "as_is"
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.lin.weight)
        _glorot(self.att_src)
        _glorot(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x, g) -> torch.Tensor:
        check_graph(g, "GATConv")
        n, nh, c = x.shape[0], self.heads, self.out_channels
        h = _linear(x, self.lin.weight)  # [n, H·C]
        hv = h.view(n, nh, c)
        if hv.dtype == torch.bfloat16:  # the scores and their softmax in float32
            hv = hv.float()
        a_src, a_dst = (hv * self.att_src).sum(-1), (hv * self.att_dst).sum(-1)  # [n, H]
        alpha = attention(a_src, a_dst, g, self.negative_slope)  # [E, H], one kernel
        alpha = edge_dropout(alpha, g, self.dropout, self.training)
        y = aggregate(h, g, weights=alpha)
        if not self.concat:
            y = y.view(n, nh, c).mean(1)
        return y if self.bias is None else y + like(self.bias, y)


__all__ = [
    "GCNConv",
    "SAGEConv",
    "GINConv",
    "GATConv",
    "BatchNorm",
    "MLP",
    "edge_softmax",
    "pyg_widths",
]
