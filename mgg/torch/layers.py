"""Layers with PyG's signatures over the distributed graph.

A layer's ``forward(x, g)`` takes this rank's rows x [n, in] (a tensor, or InputRows for
input features: SparseRows, ChunkedRows) and the job's DistGraph g, and returns [n, out].
Autograd does the rest: each aggregation's backward runs over the transposed plan.
Parameter names follow PyG, so ``layer.load_state_dict(pyg_layer.state_dict())`` works.

Writing a new layer: subclass MessagePassing (PyG's contract: mgg.torch.message), or
torch.nn.Module with ``forward(x, g)`` (first ``check_graph(g, name)``, as every layer
here, so a wrong ``g`` is named; ``rows_io`` on forward keeps Rows Rows); move rows with
``linear`` (dense or sparse input), aggregate them with ``aggregate(x, g, op)`` (op 'sum',
'mean', 'gcn') or with per-edge weights ``aggregate(x, g, weights=w)`` (w [E] or [E, H]
over ``edge_index(g)``), reach neighbors' per-node values with ``halo``, reduce across
ranks with ``all_reduce``; set ``kinds`` to the graph kinds the layer runs on
('gcn_norm', 'self_loops', 'no_self_loops', 'as_is'; ``edges(g)`` derives the first
when g is another); register a model using it in mgg.torch.models.MODELS for the CLI.
"""

from __future__ import annotations

import contextlib
import math
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..graph.core import GRAPH_KINDS
from ..precision import accumulator, torch_dtype
from .chunks import multiplies_first as by_widths
from .message import MessagePassing, scatter, softmax
from .ops import (
    InputRows,
    _held,
    aggregate,
    all_reduce,
    as_tensor,
    attention,
    check_graph,
    check_rows,
    dropout,
    edge_dropout,
    edge_ids,
    edge_index,
    gcn2,
    halo,
    like,
    picked,
)
from .ops import linear as _linear
from .rows import rows_io


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


def in_pyg_widths() -> bool:
    """Whether the layers run inside ``pyg_widths``."""
    return _pyg_order


def _narrower(x, out_dim: int, pyg: bool) -> bool:
    """Transform before aggregating: x is InputRows (sparse, or streamed); else, inside
    ``pyg_widths``, PyG's order ``pyg``; else the output is narrower."""
    if isinstance(x, InputRows):
        return True
    return pyg if _pyg_order else out_dim < x.shape[1]


WITH_LOOPS = ("self_loops", "gcn_norm")  # the kinds with one self loop per node


def _refuse(what: str, why: str):
    raise ValueError(f"{what}: {why}")


class _GCNLike(MessagePassing):
    """What GCN-style layers share: Â's weights as 'gcn' (the plan's), 'sum' or a tensor
    [E], a message x_j w_e, and mgg's kernel for it."""

    kinds = GRAPH_KINDS

    def adjacency(self, g, edge_weight, improved=False):
        """gcn_adjacency for this layer's settings, kept while ``cached``."""
        if self._cached is not None:
            return self._cached
        out = gcn_adjacency(
            g, edge_weight, self.normalize, improved, self.add_self_loops, type(self).__name__
        )
        if self.cached:
            self._cached = out
        return out

    def spread(self, g, h, w, loops):
        """Â h: the weighted aggregate plus the self term ``loops`` [n] (or None)."""
        out = self.propagate(g, x=h, edge_weight=w)
        return out if loops is None else out + h * loops.to(h.dtype)[:, None]

    def message(self, x_j, edge_weight):
        return x_j if edge_weight is None else x_j * edge_weight.to(x_j.dtype).view(-1, 1)

    def message_and_aggregate(self, g, x, edge_weight):
        if isinstance(edge_weight, str):
            return aggregate(x, g, edge_weight)
        return aggregate(x, g, weights=edge_weight)

    def propagate(self, g, size=None, **kwargs):
        w = kwargs.get("edge_weight")
        if isinstance(w, str) and not self.fusing():  # the generic path takes the weights
            kwargs["edge_weight"] = plan_weights(g) if w == "gcn" else None
        return super().propagate(g, size, **kwargs)


class GCNConv(_GCNLike):
    """Kipf & Welling: y = Â x Wᵀ + b, Â = D^-1/2 (A+I) D^-1/2 (PyG's gcn_norm: D the
    weighted in-degree of A+I; existing loops keep their weight, ``improved`` fills 2).
    x [n, in] -> y [n, out]; W [out, in] (``lin.weight``), b [out]. ``edge_weight`` [E]
    over ``edge_index(g)``'s edges (else the graph's weights, else ones).

    Fast path: a 'gcn_norm' graph (or one derived from g's source) aggregated by mgg's
    kernel with the plan's weights; any other graph gets the weights computed here (once
    while ``cached`` or the graph's own), the loops added as a self term. Aggregates at
    the smaller width: Â(x Wᵀ) when out < in (or x is sparse), else (Â x) Wᵀ. On a graph
    restricted to some rows (DistGraph.restricted) y holds those rows only ([L, out]).
    """

    picks_rows = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            _refuse("GCNConv", "add_self_loops=True needs normalize=True (as in PyG)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self._cached = None
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached = None

    def multiplies_first(self, width: int) -> bool | None:
        """As a model's first layer, given dense rows [n, width]: mgg.memory's
        multiplies_first (True: it multiplies first; False: it could, for one more
        aggregation; None: neither)."""
        return by_widths(self.out_channels, width)

    @rows_io
    def forward(self, x, g, edge_weight=None) -> torch.Tensor:
        check_graph(g, "GCNConv")
        gg, w, loops = self.adjacency(g, edge_weight, self.improved)
        if _narrower(x, self.out_channels, pyg=True):
            y = picked(self.spread(gg, _linear(x, self.lin.weight), w, loops), gg)
        else:
            y = _linear(picked(self.spread(gg, x, w, loops), gg), self.lin.weight)
        return y if self.bias is None else y + like(self.bias, y)


def plan_weights(g) -> torch.Tensor:
    """[E] float: the plan's edge weights in ``edge_index(g)``'s order."""
    p = g.plan
    return as_tensor(_held(g, "plan_weights", lambda: (np.concatenate(p.edge_weights()),))[0])


def gcn_adjacency(g, edge_weight, normalize, improved, add_self_loops, who):
    """(graph, weights, loops): what GCN-style layers aggregate over. weights: 'gcn' (the
    plan's), 'sum' (ones) or a tensor [E] over edge_index(graph); loops [n] the self
    term's coefficients, or None. PyG's gcn_norm, add_remaining_self_loops included."""
    if not normalize:
        if edge_weight is not None:
            return g, edge_weight, None
        return g, "gcn" if g.plan.has_weights else "sum", None
    if edge_weight is None and not improved and add_self_loops:
        if g.kind == "gcn_norm":
            return g, "gcn", None
        if g.source is not None:
            return g.derive("gcn_norm", who), "gcn", None
    if g.kind == "gcn_norm":
        if edge_weight is not None:
            _refuse(
                who,
                "edge_weight on a graph normalized for GCN ('gcn_norm'): prepare the "
                "graph 'as_is' (its own weights), or pass normalize=False",
            )
        g = g.derive("as_is", f"{who} (improved or add_self_loops=False: the graph's weights)")
    key = ("gcn_adjacency", improved, add_self_loops)
    if edge_weight is None and key in g.cache:
        return g, *g.cache[key]
    src, dst = edge_index(g)
    n = g.num_local_nodes
    acc = torch_dtype(accumulator(g.dtype))
    if edge_weight is not None:
        w = edge_weight.to(acc)
    elif g.plan.has_weights:
        w = plan_weights(g).to(acc)
    else:
        w = torch.ones(src.shape[0], dtype=acc, device=src.device)
    loops = None
    if add_self_loops:
        ids = edge_ids(g)
        loop = as_tensor(ids[0] == ids[1])
        loops = torch.full((n,), 2.0 if improved else 1.0, dtype=acc, device=src.device)
        loops = loops.index_put((dst[loop],), w[loop])  # existing loops keep their weight
        w = torch.where(loop, torch.zeros_like(w), w)
    deg = scatter(w, dst, n)
    if loops is not None:
        deg = deg + loops
    dinv = torch.where(deg > 0, deg.clamp(min=1e-30).rsqrt(), torch.zeros_like(deg))
    dinv_all = torch.cat([dinv, halo(dinv[:, None], g)[:, 0]])
    norm = dinv_all.index_select(0, src) * w * dinv.index_select(0, dst)
    out = norm, None if loops is None else loops * dinv * dinv
    if edge_weight is None:
        g.cache[key] = out
    return g, *out


class SAGEConv(MessagePassing):
    """Hamilton et al.: y_v = W_l · aggr_{u→v} x_u + b + W_r x_v (then L2-normalized when
    ``normalize``; ``project``: x_u = ReLU(W_p x_u + b_p) first). aggr 'mean', 'sum',
    'max' or 'min' (the last two on the generic path). x [n, in] -> y [n, out]; ``lin_l``
    (W_l, b) and ``lin_r`` (W_r) [out, in]. Sum and mean aggregate at the smaller width,
    as GCNConv. The graph as given (a GCN-normalized one is derived back, or refused). On
    a graph restricted to some rows (sum and mean) y holds those rows only ([L, out])."""

    picks_rows = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        aggr: str = "mean",
        normalize: bool = False,
        root_weight: bool = True,
        project: bool = False,
        bias: bool = True,
        **kwargs,
    ):
        if not isinstance(aggr, str):
            _refuse("SAGEConv", f"aggr must be 'mean', 'sum', 'max' or 'min', got {aggr!r}")
        super().__init__(aggr=aggr, **kwargs)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        self.lin = nn.Linear(in_channels, in_channels, bias=True) if project else None
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin, self.lin_l, self.lin_r):
            if lin is not None:
                lin.reset_parameters()

    def multiplies_first(self, width: int) -> bool | None:
        """As GCNConv's (a sum or a mean; max and min take no ChunkedRows)."""
        return by_widths(self.out_channels, width) if self.aggr in ("add", "sum", "mean") else None

    @rows_io
    def forward(self, x, g) -> torch.Tensor:
        gg = self.edges(g)
        w, b = self.lin_l.weight, self.lin_l.bias
        h = x if self.lin is None else F.relu(_linear(x, self.lin.weight, self.lin.bias))
        linear_first = self.aggr in ("add", "sum", "mean") and _narrower(
            h, self.out_channels, pyg=False
        )
        if gg.rows is not None and not self.fused():
            raise ValueError(
                f"SAGEConv(aggr={self.aggr!r}) computes every row (the generic path): only "
                "sum and mean compute the labeled rows alone"
            )
        root = None
        if linear_first:  # the sum and mean commute with W_l
            if self.lin_r is not None and isinstance(h, InputRows):  # one pass over x
                both = _linear(h, torch.cat([w, self.lin_r.weight]))
                xw, root = both.split(self.out_channels, dim=1)
                root = picked(root, gg)
            else:
                xw = _linear(h, w)
            y = picked(self.propagate(gg, x=xw), gg)
            y = y if b is None else y + like(b, y)
        else:
            y = _linear(picked(self.propagate(gg, x=h), gg), w, b)
        if self.lin_r is not None:
            if root is None:
                root = _linear(picked(x, gg), self.lin_r.weight)
            y = y + root.to(y.dtype)
        return F.normalize(y, p=2.0, dim=-1) if self.normalize else y

    def fused(self) -> bool:
        return self.aggr not in ("max", "min")  # mgg's kernel sums

    def message_and_aggregate(self, g, x):
        return aggregate(x, g, "sum" if self.aggr == "add" else self.aggr)


class BatchNorm(nn.Module):
    """Batch normalization over every rank's rows: y = (x - μ) / sqrt(σ² + eps) · γ + β,
    with μ, σ² reduced across ranks, so P ranks compute what one process does.
    x [n, C] -> [n, C] (x's dtype; the statistics in float32 for bf16 x); the parameters
    and buffers of torch.nn.BatchNorm1d (γ, β only when ``affine``; the running
    statistics only when ``track_running_stats``). ``g``: the job's graph (Rows x bring
    theirs)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        allow_single_element: bool = False,
        mode: str = "node",
    ):
        super().__init__()
        if mode != "node":
            _refuse("BatchNorm", f"mode={mode!r}: mgg normalizes over the nodes ('node')")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.allow_single_element = allow_single_element
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    @rows_io
    def forward(self, x: torch.Tensor, g=None) -> torch.Tensor:
        check_graph(g, "BatchNorm")
        rows, x = x, x.float() if x.dtype == torch.bfloat16 else x
        if not self.training and self.track_running_stats:
            mean, var = self.running_mean, self.running_var
        else:
            check_rows(x, g, "BatchNorm")  # this rank's rows: the plan counts all ranks'
            count = g.plan.num_nodes
            if count < 2 and not (count == 1 and self.allow_single_element):
                raise ValueError(f"batch normalization needs at least 2 rows, got {count}")
            mean = all_reduce(x.sum(0), g) / count
            var = all_reduce(((x - mean) ** 2).sum(0), g) / count
            if self.track_running_stats and self.training:
                with torch.no_grad():
                    m = self.momentum
                    self.running_mean.mul_(1 - m).add_(m * mean)
                    self.running_var.mul_(1 - m).add_(m * var * count / max(count - 1, 1))
                    self.num_batches_tracked += 1
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y.to(rows.dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if not self.track_running_stats:  # a state written while it tracked them
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                state_dict.pop(prefix + k, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class MLP(nn.Module):
    """Linear -> [BatchNorm] -> ReLU -> ... -> Linear over ``channels`` [in, ..., out]
    (GIN's MLP). forward(x, g): g reduces the batch statistics across ranks.
    ``running_stats=False``: the norms evaluate with the statistics of the rows they get,
    as they train (BatchNorm's ``track_running_stats``)."""

    def __init__(self, channels: list[int], batch_norm: bool = True, running_stats: bool = True):
        super().__init__()
        if len(channels) < 2:
            raise ValueError(f"an MLP needs at least [in, out] channels, got {channels}")
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(channels))
        self.norms = nn.ModuleList(
            BatchNorm(c, track_running_stats=running_stats) if batch_norm else nn.Identity()
            for c in channels[1:-1]
        )

    @rows_io
    def forward(self, x, g=None, first_done: bool = False) -> torch.Tensor:
        """``first_done``: x already went through the first Linear (GINConv's order)."""
        check_graph(g, "MLP")
        for i, lin in enumerate(self.lins):
            if i > 0 or not first_done:
                x = _linear(x, lin.weight, lin.bias)
            if i < len(self.norms):
                norm = self.norms[i]
                x = F.relu(norm(x, g) if isinstance(norm, BatchNorm) else x)
        return x


class GINConv(MessagePassing):
    """Xu et al.: y_v = MLP((1 + ε) x_v + sum_{u→v} x_u).  x [n, in] -> [n, out].

    ``nn``: an mgg.torch.MLP (batch statistics over all ranks) or any module of x whose
    first layer, if a torch.nn.Linear narrower than in, is applied before aggregating
    (it commutes with the sum). ε is a parameter when ``train_eps``.
    """

    def __init__(self, nn: nn.Module, eps: float = 0.0, train_eps: bool = False, **kwargs):
        super().__init__(aggr="add", **kwargs)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.tensor([eps]))
        else:
            self.register_buffer("eps", torch.tensor([eps]))

    def reset_parameters(self) -> None:
        self.eps.data.fill_(self.initial_eps)

    def multiplies_first(self, width: int) -> bool | None:
        """As GCNConv's, by the nn's first Linear (None without one)."""
        first = self._first_linear()
        return None if first is None else by_widths(first.out_features, width)

    def _first_linear(self):
        if isinstance(self.nn, MLP):
            return self.nn.lins[0]
        if isinstance(self.nn, torch.nn.Sequential) and isinstance(self.nn[0], nn.Linear):
            return self.nn[0]
        return None

    @rows_io
    def forward(self, x, g) -> torch.Tensor:
        gg = self.edges(g)
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
        elif isinstance(x, InputRows):
            raise ValueError(
                f"GINConv on {x.what} ({type(x).__name__}) needs an nn starting with a Linear"
            )
        h = self.propagate(gg, x=x)
        if narrow and first.bias is not None:
            h = h + like(first.bias, h)
        if isinstance(self.nn, MLP):
            return self.nn(h, g, first_done=narrow)
        if narrow:
            return self.nn[1:](h)
        return self.nn(h)

    def message_and_aggregate(self, g, x):
        return aggregate(x, g, "gin", eps=self.eps)  # (1 + eps) x + sum, in one kernel

    def update(self, inputs, x):
        if self.fusing():  # the kernel added (1 + eps) x
            return inputs
        return inputs + (1 + self.eps.to(x.dtype)) * x


class GATConv(MessagePassing):
    """Veličković et al.: y_v = ‖_h sum_{u→v} α^h_uv W^h x_u + b, with
    α^h_uv = softmax_u(LeakyReLU(a^h_src · W^h x_u + a^h_dst · W^h x_v)) over v's in-edges
    (self loops added unless ``add_self_loops=False``: a graph without them is derived
    with one loop per node). x [n, in] -> [n, heads·out] (concat) or [n, out] (mean of
    the heads); ``lin.weight`` [heads·out, in], ``att_src``/``att_dst`` [1, heads, out].

    Fused: only the per-node scores a_src of remote sources and their rows W x_u cross
    ranks, the softmax of a node's in-edges runs in one kernel on its rank; ``dropout``
    drops attention coefficients (rank-invariant masks).
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
        edge_dim: int | None = None,
        fill_value="mean",
        bias: bool = True,
        residual: bool = False,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        if edge_dim is not None:
            _refuse("GATConv", "mgg's fused GAT has no edge features: GATv2Conv(edge_dim=) has")
        if residual:
            _refuse("GATConv", "residual=True: add a Linear of x to the output yourself")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops = add_self_loops
        self.kinds = WITH_LOOPS if add_self_loops else GRAPH_KINDS
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

    def multiplies_first(self, width: int) -> bool | None:
        """As GCNConv's: always."""
        return True

    @rows_io
    def forward(self, x, g, return_attention_weights=None):
        """[n, out]; with ``return_attention_weights``, (out, (edge_index [2, E] of
        global (source, destination) ids, α [E, H])) over this rank's edges."""
        gg = self.edges(g)
        n, nh, c = x.shape[0], self.heads, self.out_channels
        h = _linear(x, self.lin.weight)  # [n, H·C]
        hv = h.view(n, nh, c)
        if hv.dtype == torch.bfloat16:  # the scores and their softmax in float32
            hv = hv.float()
        a_src, a_dst = (hv * self.att_src).sum(-1), (hv * self.att_dst).sum(-1)  # [n, H]
        if self.fuse:
            alpha = attention(a_src, a_dst, gg, self.negative_slope)  # [E, H], one kernel
        else:
            src, dst = edge_index(gg)
            score = torch.cat([a_src, halo(a_src, gg)]).index_select(0, src)
            score = F.leaky_relu(score + a_dst.index_select(0, dst), self.negative_slope)
            alpha = softmax(score, dst, num_nodes=n)
        alpha = edge_dropout(alpha, gg, self.dropout, self.training)
        y = self.propagate(gg, x=h, alpha=alpha)
        if not self.concat:
            y = y.view(n, nh, c).mean(1)
        y = y if self.bias is None else y + like(self.bias, y)
        if return_attention_weights:
            dst, src = (as_tensor(a) for a in edge_ids(gg))
            return y, (torch.stack([src, dst]), alpha)
        return y

    def message(self, x_j, alpha):
        heads = alpha.shape[1]
        msg = x_j.view(-1, heads, x_j.shape[1] // heads) * alpha.to(x_j.dtype)[..., None]
        return msg.reshape(x_j.shape)

    def message_and_aggregate(self, g, x, alpha):
        return aggregate(x, g, weights=alpha)


class GATv2Conv(MessagePassing):
    """Brody et al.: α^h_uv = softmax_u(a^h · LeakyReLU(W_l x_u + W_r x_v [+ W_e e_uv])),
    y_v = ‖_h sum_{u→v} α^h_uv (W_l x_u)^h + b. PyG's parameters (``lin_l``, ``lin_r``,
    ``att`` [1, H, C], ``lin_edge``, ``bias``). Self loops added as GATConv's; with edge
    features (``edge_dim``) the graph's own loops only (``add_self_loops=False``)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value="mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        if edge_dim is not None and add_self_loops:
            _refuse(
                "GATv2Conv",
                "edge_dim with add_self_loops: the added loops would need edge features; "
                "pass add_self_loops=False on a graph prepared 'self_loops' with its own",
            )
        if residual:
            _refuse("GATv2Conv", "residual=True: add a Linear of x to the output yourself")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.share_weights = add_self_loops, share_weights
        self.kinds = WITH_LOOPS if add_self_loops else GRAPH_KINDS
        self.lin_l = nn.Linear(in_channels, heads * out_channels, bias=bias)
        self.lin_r = (
            self.lin_l if share_weights else nn.Linear(in_channels, heads * out_channels, bias)
        )
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = (
            None if edge_dim is None else nn.Linear(edge_dim, heads * out_channels, bias=False)
        )
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_l, self.lin_r, self.lin_edge):
            if lin is not None:
                _glorot(lin.weight)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        _glorot(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @rows_io
    def forward(self, x, g, edge_attr=None) -> torch.Tensor:
        gg = self.edges(g)
        n, nh, c = x.shape[0], self.heads, self.out_channels
        x_l = _linear(x, self.lin_l.weight, self.lin_l.bias).view(n, nh, c)
        x_r = x_l if self.share_weights else _linear(x, self.lin_r.weight, self.lin_r.bias)
        x_r = x_r.view(n, nh, c)
        y = self.propagate(gg, x=(x_l, x_r), edge_attr=edge_attr, graph=gg)
        y = y.reshape(n, nh * c) if self.concat else y.mean(1)
        return y if self.bias is None else y + like(self.bias, y)

    def message(self, x_j, x_i, edge_attr, index, dim_size, graph):
        e = x_i + x_j
        if edge_attr is not None:
            if self.lin_edge is None:
                _refuse("GATv2Conv", "edge_attr given but the layer has no edge_dim")
            ea = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
            e = e + self.lin_edge(ea).view(-1, self.heads, self.out_channels)
        score = (F.leaky_relu(e, self.negative_slope) * self.att).sum(-1)
        alpha = softmax(score, index, num_nodes=dim_size)
        alpha = edge_dropout(alpha, graph, self.dropout, self.training)
        return x_j * alpha[..., None]


class GCN2Conv(_GCNLike):
    """Chen et al. (GCNII): y = ((1-α) Â x + α x₀)((1-β) I + β W), β = log(θ/ℓ + 1)
    (β = 1 without θ); ``shared_weights=False``: x₀'s term gets its own W₂. Â as
    GCNConv's (``normalize=False``: the graph's weights, e.g. a 'gcn_norm' graph's).
    x, x₀ [n, C] -> [n, C]; ``weight1`` (and ``weight2``) [C, C]."""

    def __init__(
        self,
        channels: int,
        alpha: float,
        theta: float | None = None,
        layer: int | None = None,
        shared_weights: bool = True,
        cached: bool = False,
        add_self_loops: bool = True,
        normalize: bool = True,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        self.channels, self.alpha = channels, alpha
        self.beta = 1.0 if theta is None or layer is None else math.log(theta / layer + 1)
        self.cached, self.add_self_loops, self.normalize = cached, add_self_loops, normalize
        self._cached = None
        self.weight1 = nn.Parameter(torch.empty(channels, channels))
        self.weight2 = None if shared_weights else nn.Parameter(torch.empty(channels, channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.weight1)
        if self.weight2 is not None:
            _glorot(self.weight2)
        self._cached = None

    @rows_io
    def forward(self, x, x_0, g, edge_weight=None) -> torch.Tensor:
        check_graph(g, "GCN2Conv")
        gg, w, loops = self.adjacency(g, edge_weight)
        if x_0.shape[0] != x.shape[0]:
            x_0 = x_0[: x.shape[0]]
        if self.weight2 is None and isinstance(w, str) and loops is None and self.fusing():
            return gcn2(x, x_0, self.weight1, gg, w, self.alpha, self.beta)
        h = self.spread(gg, x, w, loops)
        x_0, b = x_0.to(h.dtype), self.beta
        w1 = like(self.weight1, h)
        if self.weight2 is None:
            out = torch.lerp(h, x_0, self.alpha)  # (1 - α) h + α x₀ in one pass
            return torch.addmm(out, out, w1, beta=1.0 - b, alpha=b)
        h, x_0 = h * (1 - self.alpha), self.alpha * x_0
        w2 = like(self.weight2, h)
        return torch.addmm(h, h, w1, beta=1.0 - b, alpha=b) + torch.addmm(
            x_0, x_0, w2, beta=1.0 - b, alpha=b
        )


class APPNP(_GCNLike):
    """Gasteiger et al.: K steps of h ← (1-α) Â h + α x (Â as GCNConv's). x [n, C] ->
    [n, C], no parameters. ``dropout`` drops Â's entries in training (rank-invariant
    masks, as edge_dropout)."""

    def __init__(
        self,
        K: int,
        alpha: float,
        dropout: float = 0.0,
        cached: bool = False,
        add_self_loops: bool = True,
        normalize: bool = True,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        self.K, self.alpha, self.dropout = K, alpha, dropout
        self.cached, self.add_self_loops, self.normalize = cached, add_self_loops, normalize
        self._cached = None

    def reset_parameters(self) -> None:
        self._cached = None

    @rows_io
    def forward(self, x, g, edge_weight=None) -> torch.Tensor:
        check_graph(g, "APPNP")
        gg, w, loops = self.adjacency(g, edge_weight)
        h = x
        for _ in range(self.K):
            wk, lk = w, loops
            if self.dropout > 0 and self.training:  # Â's entries: edges and loops
                if isinstance(wk, str):
                    src = edge_index(gg)[0]
                    wk = plan_weights(gg) if wk == "gcn" else torch.ones_like(src, dtype=h.dtype)
                wk = edge_dropout(wk, gg, self.dropout)
                if lk is not None:
                    lk = dropout(lk[:, None], gg, self.dropout)[:, 0]
            h = self.spread(gg, h, wk, lk) * (1 - self.alpha) + self.alpha * x
        return h


class GINEConv(MessagePassing):
    """Hu et al.: y_v = nn((1 + ε) x_v + sum_{u→v} ReLU(x_u + e_uv)), e_uv the edge
    features (``edge_dim``: projected by ``lin`` to x's width first). x [n, C] ->
    nn's output; edge_attr [E, C or edge_dim] over ``edge_index(g)``."""

    def __init__(
        self,
        nn: torch.nn.Module,
        eps: float = 0.0,
        train_eps: bool = False,
        edge_dim: int | None = None,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        self.nn, self.initial_eps = nn, eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.tensor([eps]))
        else:
            self.register_buffer("eps", torch.tensor([eps]))
        self.lin = None
        if edge_dim is not None:
            first = next((m for m in nn.modules() if isinstance(m, torch.nn.Linear)), None)
            if first is None:
                _refuse("GINEConv", "edge_dim needs an nn whose first layer is a Linear")
            self.lin = torch.nn.Linear(edge_dim, first.in_features)

    def reset_parameters(self) -> None:
        self.eps.data.fill_(self.initial_eps)
        if self.lin is not None:
            self.lin.reset_parameters()

    @rows_io
    def forward(self, x, g, edge_attr) -> torch.Tensor:
        gg = self.edges(g)
        out = self.propagate(gg, x=x, edge_attr=edge_attr)
        return self.nn(out + (1 + self.eps.to(x.dtype)) * x)

    def message(self, x_j, edge_attr):
        if self.lin is None and x_j.shape[-1] != edge_attr.shape[-1]:
            _refuse(
                "GINEConv",
                f"edge_attr has {edge_attr.shape[-1]} features and x {x_j.shape[-1]}: "
                "pass edge_dim to project them",
            )
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        return (x_j + edge_attr).relu()


class EdgeConv(MessagePassing):
    """Wang et al. (DGCNN): y_v = aggr_{u→v} nn([x_v, x_u - x_v]) (default max).
    x [n, C] -> nn's output [n, C']."""

    def __init__(self, nn: torch.nn.Module, aggr: str = "max", **kwargs):
        super().__init__(aggr=aggr, **kwargs)
        self.nn = nn

    def reset_parameters(self) -> None:
        for m in self.nn.modules():
            if m is not self.nn and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    @rows_io
    def forward(self, x, g) -> torch.Tensor:
        return self.propagate(self.edges(g), x=x)

    def message(self, x_i, x_j):
        return self.nn(torch.cat([x_i, x_j - x_i], dim=-1))


__all__ = [
    "GCNConv",
    "SAGEConv",
    "GINConv",
    "GATConv",
    "GATv2Conv",
    "GCN2Conv",
    "APPNP",
    "GINEConv",
    "EdgeConv",
    "BatchNorm",
    "MLP",
    "pyg_widths",
]
