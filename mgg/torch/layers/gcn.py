"""The GCN family: layers over GCN's normalized adjacency Â (GCNConv, GCNII's GCN2Conv,
APPNP), its weights the plan's where the graph is prepared 'gcn_norm', else computed
here as PyG's gcn_norm does."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import InputError
from ...graph.core import GRAPH_KINDS
from ...precision import accumulator, torch_dtype
from ..aggregation import aggregate, gcn2, halo, picked
from ..checks import check_edge_values, check_features
from ..chunks import multiplies_first as by_widths
from ..dropouts import dropout, edge_dropout, edge_ids, edge_index
from ..inputs import linear
from ..interop import as_tensor, like
from ..message import MessagePassing, scatter
from ..plan_arrays import PlanArrays
from ..rows import rows_io
from .base import glorot, narrower, refuse


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
    """Kipf & Welling's graph convolution:

        Y = Â X Wᵀ + b,   Â = D^-1/2 (A + I) D^-1/2

    with D the weighted in-degree of A + I (PyG's gcn_norm: loops the graph has keep
    their weight; ``improved`` fills 2). It aggregates at the smaller width: Â (X Wᵀ)
    when out < in (or X is InputRows), else (Â X) Wᵀ. A 'gcn_norm' graph (or one derived
    from g's source) runs mgg's kernel with the plan's weights; any other graph gets the
    weights computed here (once while ``cached``), the loops added as a self term.

    Args:
        in_channels: the input's width.
        out_channels: the output's width.
        improved: loops of weight 2: Â = D^-1/2 (A + 2I) D^-1/2.
        cached: keep Â after the first call (the graph does not change).
        add_self_loops: A + I (default: ``normalize``).
        normalize: Â normalized as above; False: the graph's weights (or ones).
        bias: learn b.

    Shapes:
        input: x [n, in_channels] (a tensor or InputRows), g the job's DistGraph,
            edge_weight [E] over ``edge_index(g)``'s edges (optional: the graph's own);
            W is ``lin.weight`` [out_channels, in_channels], b ``bias`` [out_channels]
        output: [n, out_channels]; on g restricted to some rows (DistGraph.restricted)
            those rows only, [L, out_channels]
    """

    picks_rows = True
    pyg_order = False  # aggregate where PyG does (pyg_widths)

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
            refuse("GCNConv", "add_self_loops=True needs normalize=True (as in PyG)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self._cached = None
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached = None

    def multiplies_first(self, width: int) -> bool | None:
        """As a model's first layer, given dense rows [n, width]: mgg.torch.chunks'
        multiplies_first (True: it multiplies first; False: it could, for one more
        aggregation; None: neither)."""
        return by_widths(self.out_channels, width)

    @rows_io
    def forward(self, x, g, edge_weight=None) -> torch.Tensor:
        check_features(x, g, "GCNConv", self.in_channels)
        gg, w, loops = self.adjacency(g, edge_weight, self.improved)
        if narrower(self, x, self.out_channels, pyg=True):
            y = picked(self.spread(gg, linear(x, self.lin.weight), w, loops), gg)
        else:
            y = linear(picked(self.spread(gg, x, w, loops), gg), self.lin.weight)
        return y if self.bias is None else y + like(self.bias, y)


def plan_weights(g) -> torch.Tensor:
    """[E] float: the plan's edge weights in ``edge_index(g)``'s order."""
    return as_tensor(PlanArrays.of(g).weights)


def gcn_adjacency(g, edge_weight, normalize, improved, add_self_loops, who):
    """(graph, weights, loops): what GCN-style layers aggregate over. weights: 'gcn' (the
    plan's), 'sum' (ones) or a tensor [E] over edge_index(graph); loops [n] the self
    term's coefficients, or None. PyG's gcn_norm, add_remaining_self_loops included."""
    acc = torch_dtype(accumulator(g.dtype))
    if edge_weight is not None:
        check_edge_values(edge_weight, g, who, "edge_weight", ndims=(1,))
    if not normalize:
        if edge_weight is not None:
            return g, edge_weight.to(acc), None
        return g, "gcn" if g.plan.has_weights else "sum", None
    if edge_weight is None and not improved and add_self_loops:
        if g.kind == "gcn_norm":
            return g, "gcn", None
        if g.source is not None:
            return g.derive("gcn_norm", who), "gcn", None
    if g.kind == "gcn_norm":
        if edge_weight is not None:
            refuse(
                who,
                "edge_weight on a graph normalized for GCN ('gcn_norm'): prepare the "
                "graph 'as_is' (its own weights), or pass normalize=False",
            )
        g = g.derive("as_is", f"{who} (improved or add_self_loops=False: the graph's weights)")
    norms, key = PlanArrays.of(g).gcn_norms, (improved, add_self_loops)
    if edge_weight is None and key in norms:
        return g, *norms[key]
    src, dst = edge_index(g)
    n = g.num_local_nodes
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
        norms[key] = out
    return g, *out


class GCN2Conv(_GCNLike):
    """Chen et al.'s GCNII layer:

        Y = ((1-α) Â X + α X₀) ((1-β) I + β W),   β = log(θ/ℓ + 1)

    (β = 1 without θ and ℓ); with ``shared_weights=False`` X₀'s term gets its own W₂:
    (1-α) Â X ((1-β) I + β W) + α X₀ ((1-β) I + β W₂). Â as GCNConv's. With shared
    weights and the plan's Â, one op (mgg.torch.aggregation's gcn2) whose backward sums in
    its GEMM.

    Args:
        channels: the width of X, X₀ and Y.
        alpha: α, the share of the initial features X₀.
        theta: θ (with ``layer``: β = log(θ/ℓ + 1); None: β = 1).
        layer: ℓ, this layer's depth (1-based).
        shared_weights: one W for both terms; False: W₂ for X₀'s.
        cached: keep Â after the first call.
        add_self_loops: A + I in Â.
        normalize: Â normalized as GCNConv's; False: the graph's weights (a 'gcn_norm'
            graph's).

    Shapes:
        input: x [n, channels], x_0 [n, channels] (its first n rows are taken), g the
            job's DistGraph, edge_weight [E] (optional); W ``weight1`` and W₂
            ``weight2`` [channels, channels]
        output: [n, channels]
    """

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
        glorot(self.weight1)
        if self.weight2 is not None:
            glorot(self.weight2)
        self._cached = None

    @rows_io
    def forward(self, x, x_0, g, edge_weight=None) -> torch.Tensor:
        check_features(x, g, "GCN2Conv", self.channels)
        _check_x0(x_0, x, "GCN2Conv")
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


def _check_x0(x_0, x, who: str) -> None:
    """GCNII's x₀: a tensor [>= n, C] (its first n rows are taken) of x's width."""
    n, c = x.shape
    if not isinstance(x_0, torch.Tensor) or x_0.ndim != 2:
        got = tuple(x_0.shape) if isinstance(x_0, torch.Tensor) else type(x_0).__name__
        raise InputError(f"{who}: x_0 must be a tensor [{n}, {c}] (the initial rows), got {got}")
    if x_0.shape[0] < n or x_0.shape[1] != c:
        raise InputError(
            f"{who}: x_0 must be [{n}, {c}] (its first {n} rows are taken), got shape "
            f"{tuple(x_0.shape)}"
        )


class APPNP(_GCNLike):
    """Gasteiger et al.'s personalized-PageRank propagation, K steps of

        H ← (1-α) Â H + α X,   H₀ = X

    (Â as GCNConv's); no parameters. ``dropout`` drops Â's entries in training, edges
    and loops (rank-invariant masks, as edge_dropout).

    Args:
        K: the number of steps.
        alpha: α, the teleport share of X.
        dropout: the probability of dropping each entry of Â, in training.
        cached: keep Â after the first call.
        add_self_loops: A + I in Â.
        normalize: Â normalized as GCNConv's; False: the graph's weights.

    Shapes:
        input: x [n, C], g the job's DistGraph, edge_weight [E] (optional)
        output: [n, C]
    """

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
        check_features(x, g, "APPNP")
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
