"""GraphSAGE's layer (SAGEConv)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InputError
from ..aggregation import aggregate, picked
from ..checks import InputRows, check_features
from ..chunks import multiplies_first as by_widths
from ..inputs import linear
from ..interop import like
from ..message import MessagePassing
from ..rows import rows_io
from .base import narrower, refuse


class SAGEConv(MessagePassing):
    """Hamilton et al.'s GraphSAGE layer:

        y_v = W_l · aggr_{u→v} x_u + b + W_r x_v

    then L2-normalized with ``normalize``; with ``project``, x_u = ReLU(W_p x_u + b_p)
    first. Sum and mean aggregate at the smaller width, as GCNConv (they commute with
    W_l); max and min run the generic path. The graph as given (a GCN-normalized one is
    derived back, or refused).

    Args:
        in_channels: the input's width.
        out_channels: the output's width.
        aggr: 'mean', 'sum' ('add'), 'max' or 'min'.
        normalize: L2-normalize each output row.
        root_weight: add W_r x_v.
        project: project the sources first (``lin``: W_p, b_p).
        bias: learn b.

    Shapes:
        input: x [n, in_channels] (a tensor or InputRows), g the job's DistGraph;
            ``lin_l`` (W_l, b) and ``lin_r`` (W_r) [out_channels, in_channels]
        output: [n, out_channels]; on g restricted to some rows (sum and mean) those
            rows only, [L, out_channels]
    """

    picks_rows = True
    pyg_order = False  # aggregate where PyG does (pyg_widths)

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
            refuse("SAGEConv", f"aggr must be 'mean', 'sum', 'max' or 'min', got {aggr!r}")
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
        check_features(x, g, "SAGEConv", self.in_channels)
        gg = self.edges(g)
        w, b = self.lin_l.weight, self.lin_l.bias
        h = x if self.lin is None else F.relu(linear(x, self.lin.weight, self.lin.bias))
        linear_first = self.aggr in ("add", "sum", "mean") and narrower(
            self, h, self.out_channels, pyg=False
        )
        if gg.rows is not None and not self.fused():
            raise InputError(
                f"SAGEConv(aggr={self.aggr!r}) computes every row (the generic path): only "
                "sum and mean compute the labeled rows alone"
            )
        root = None
        if linear_first:  # the sum and mean commute with W_l
            if self.lin_r is not None and isinstance(h, InputRows):  # one pass over x
                both = linear(h, torch.cat([w, self.lin_r.weight]))
                xw, root = both.split(self.out_channels, dim=1)
                root = picked(root, gg)
            else:
                xw = linear(h, w)
            y = picked(self.propagate(gg, x=xw), gg)
            y = y if b is None else y + like(b, y)
        else:
            y = linear(picked(self.propagate(gg, x=h), gg), w, b)
        if self.lin_r is not None:
            if root is None:
                root = linear(picked(x, gg), self.lin_r.weight)
            y = y + root.to(y.dtype)
        return F.normalize(y, p=2.0, dim=-1) if self.normalize else y

    def fused(self) -> bool:
        return self.aggr not in ("max", "min")  # mgg's kernel sums

    def message_and_aggregate(self, g, x):
        return aggregate(x, g, "sum" if self.aggr == "add" else self.aggr)
