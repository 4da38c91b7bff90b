"""The GAT family: GATConv (its attention softmax in one kernel) and GATv2Conv (on
MessagePassing, with edge features)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...graph.core import GRAPH_KINDS
from ..aggregation import aggregate, halo
from ..checks import check_edge_values, check_features
from ..dropouts import edge_dropout, edge_ids, edge_index
from ..gat_softmax import attention
from ..inputs import linear
from ..interop import as_tensor, like
from ..message import MessagePassing, softmax
from ..rows import rows_io
from .base import WITH_LOOPS, glorot, refuse


class GATConv(MessagePassing):
    """Veličković et al.'s graph attention layer:

        y_v = ‖_h Σ_{u→v} α^h_uv W^h x_u + b
        α^h_uv = softmax_u(LeakyReLU(a^h_src · W^h x_u + a^h_dst · W^h x_v))

    the softmax over v's in-edges (self loops added unless ``add_self_loops=False``: a
    graph without them is derived with one loop per node). Fused: only the per-node
    scores a_src of remote sources and their rows W x_u cross ranks, and the softmax of
    a node's in-edges runs in one kernel on its rank.

    Args:
        in_channels: the input's width.
        out_channels: C, each head's width.
        heads: H, the attention heads.
        concat: concatenate the heads (H·C); False: their mean (C).
        negative_slope: LeakyReLU's.
        dropout: drop attention coefficients in training (rank-invariant masks).
        add_self_loops: one loop per node.
        edge_dim, residual: refused (GATv2Conv takes edge features).
        fill_value: PyG's, unused (loops come from the graph).
        bias: learn b.

    Shapes:
        input: x [n, in_channels] (a tensor or InputRows), g the job's DistGraph;
            ``lin.weight`` [H·C, in_channels], ``att_src`` and ``att_dst`` [1, H, C]
        output: [n, H·C] (concat) or [n, C]; with ``return_attention_weights``, also
            (edge_index [2, E] of global (source, destination) ids, α [E, H]) over this
            rank's edges
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
            refuse("GATConv", "mgg's fused GAT has no edge features: GATv2Conv(edge_dim=) has")
        if residual:
            refuse("GATConv", "residual=True: add a Linear of x to the output yourself")
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
        glorot(self.lin.weight)
        glorot(self.att_src)
        glorot(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def multiplies_first(self, width: int) -> bool | None:
        """As GCNConv's: always."""
        return True

    @rows_io
    def forward(self, x, g, return_attention_weights=None):
        """[n, out]; with ``return_attention_weights``, (out, (edge_index [2, E] of
        global (source, destination) ids, α [E, H])) over this rank's edges."""
        check_features(x, g, "GATConv", self.in_channels)
        gg = self.edges(g)
        n, nh, c = x.shape[0], self.heads, self.out_channels
        h = linear(x, self.lin.weight)  # [n, H·C]
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
    """Brody et al.'s dynamic graph attention:

        y_v = ‖_h Σ_{u→v} α^h_uv (W_l x_u)^h + b
        α^h_uv = softmax_u(a^h · LeakyReLU(W_l x_u + W_r x_v [+ W_e e_uv]))

    on MessagePassing. Self loops added as GATConv's; with edge features the graph's own
    loops only (``add_self_loops=False``).

    Args:
        in_channels: the input's width.
        out_channels: C, each head's width.
        heads: H, the attention heads.
        concat: concatenate the heads (H·C); False: their mean (C).
        negative_slope: LeakyReLU's.
        dropout: drop attention coefficients in training (rank-invariant masks).
        add_self_loops: one loop per node (not with ``edge_dim``).
        edge_dim: the edge features' width (``lin_edge``: W_e).
        fill_value: PyG's, unused (loops come from the graph).
        bias: learn b (and the biases of ``lin_l``, ``lin_r``).
        share_weights: W_r = W_l.
        residual: refused.

    Shapes:
        input: x [n, in_channels], g the job's DistGraph, edge_attr [E, edge_dim] over
            ``edge_index(g)``'s edges (optional); ``lin_l``, ``lin_r`` [H·C,
            in_channels], ``att`` [1, H, C]
        output: [n, H·C] (concat) or [n, C]
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
        share_weights: bool = False,
        residual: bool = False,
        **kwargs,
    ):
        super().__init__(aggr="add", **kwargs)
        if edge_dim is not None and add_self_loops:
            refuse(
                "GATv2Conv",
                "edge_dim with add_self_loops: the added loops would need edge features; "
                "pass add_self_loops=False on a graph prepared 'self_loops' with its own",
            )
        if residual:
            refuse("GATv2Conv", "residual=True: add a Linear of x to the output yourself")
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
                glorot(lin.weight)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        glorot(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @rows_io
    def forward(self, x, g, edge_attr=None) -> torch.Tensor:
        check_features(x, g, "GATv2Conv", self.in_channels)
        gg = self.edges(g)
        if edge_attr is not None:
            check_edge_values(edge_attr, gg, "GATv2Conv", "edge_attr")
            if self.lin_edge is None:
                refuse("GATv2Conv", "edge_attr given but the layer has no edge_dim")
            width = 1 if edge_attr.ndim == 1 else edge_attr.shape[1]
            if width != self.lin_edge.in_features:
                refuse(
                    "GATv2Conv",
                    f"edge_attr has {width} features but edge_dim is "
                    f"{self.lin_edge.in_features}: edge_attr must be "
                    f"[E, {self.lin_edge.in_features}], got shape {tuple(edge_attr.shape)}",
                )
        n, nh, c = x.shape[0], self.heads, self.out_channels
        x_l = linear(x, self.lin_l.weight, self.lin_l.bias).view(n, nh, c)
        x_r = x_l if self.share_weights else linear(x, self.lin_r.weight, self.lin_r.bias)
        x_r = x_r.view(n, nh, c)
        y = self.propagate(gg, x=(x_l, x_r), edge_attr=edge_attr, graph=gg)
        y = y.reshape(n, nh * c) if self.concat else y.mean(1)
        return y if self.bias is None else y + like(self.bias, y)

    def message(self, x_j, x_i, edge_attr, index, dim_size, graph):
        e = x_i + x_j
        if edge_attr is not None:
            if self.lin_edge is None:
                refuse("GATv2Conv", "edge_attr given but the layer has no edge_dim")
            ea = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
            e = e + self.lin_edge(ea).view(-1, self.heads, self.out_channels)
        score = (F.leaky_relu(e, self.negative_slope) * self.att).sum(-1)
        alpha = softmax(score, index, num_nodes=dim_size)
        alpha = edge_dropout(alpha, graph, self.dropout, self.training)
        return x_j * alpha[..., None]
