"""The GIN family: GINConv and GINEConv (GIN with edge features)."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import InputError
from ..aggregation import aggregate
from ..checks import InputRows, check_edge_values, check_features
from ..chunks import multiplies_first as by_widths
from ..inputs import linear
from ..interop import like
from ..message import MessagePassing
from ..rows import rows_io
from .base import narrower, refuse
from .norm import MLP


class GINConv(MessagePassing):
    """Xu et al.'s graph isomorphism layer:

        y_v = nn((1 + ε) x_v + Σ_{u→v} x_u)

    in one kernel ((1 + ε) x + sum). A first Linear of ``nn`` narrower than x is applied
    before aggregating (it commutes with the sum).

    Args:
        nn: an mgg.torch.MLP (batch statistics over every rank) or any module of the
            rows; torch's own BatchNorm is refused on several ranks.
        eps: ε's initial value.
        train_eps: learn ε.

    Shapes:
        input: x [n, in] (InputRows only when ``nn`` starts with a Linear), g the job's
            DistGraph; ε ``eps`` [1]
        output: nn's output [n, out]
    """

    pyg_order = False  # aggregate where PyG does (pyg_widths)

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
        first = self._first_linear()
        takes = self.nn if first is None and isinstance(self.nn, nn.Linear) else first
        check_features(x, g, "GINConv", None if takes is None else takes.in_features)
        gg = self.edges(g)
        if g.size > 1 and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.nn.modules()
        ):
            raise InputError(
                "torch's BatchNorm normalizes each rank's rows alone: use mgg.torch.MLP or "
                "mgg.torch.BatchNorm, whose statistics cover every rank"
            )
        narrow = first is not None and narrower(self, x, first.out_features, pyg=False)
        if narrow:
            x = linear(x, first.weight)
        elif isinstance(x, InputRows):
            raise InputError(
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


class GINEConv(MessagePassing):
    """Hu et al.'s GIN with edge features:

        y_v = nn((1 + ε) x_v + Σ_{u→v} ReLU(x_u + e_uv))

    with ``edge_dim``, e_uv projected to x's width by ``lin`` first.

    Args:
        nn: a module of the rows.
        eps: ε's initial value.
        train_eps: learn ε.
        edge_dim: the edge features' width, when not x's (``nn`` must start with a
            Linear, whose input width ``lin`` projects to).

    Shapes:
        input: x [n, C], g the job's DistGraph, edge_attr [E, C or edge_dim] over
            ``edge_index(g)``'s edges
        output: nn's output [n, C']
    """

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
                refuse("GINEConv", "edge_dim needs an nn whose first layer is a Linear")
            self.lin = torch.nn.Linear(edge_dim, first.in_features)

    def reset_parameters(self) -> None:
        self.eps.data.fill_(self.initial_eps)
        if self.lin is not None:
            self.lin.reset_parameters()

    @rows_io
    def forward(self, x, g, edge_attr) -> torch.Tensor:
        check_features(x, g, "GINEConv")
        gg = self.edges(g)
        check_edge_values(edge_attr, gg, "GINEConv", "edge_attr")
        out = self.propagate(gg, x=x, edge_attr=edge_attr)
        return self.nn(out + (1 + self.eps.to(x.dtype)) * x)

    def message(self, x_j, edge_attr):
        if self.lin is None and x_j.shape[-1] != edge_attr.shape[-1]:
            refuse(
                "GINEConv",
                f"edge_attr has {edge_attr.shape[-1]} features and x {x_j.shape[-1]}: "
                "pass edge_dim to project them",
            )
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        return (x_j + edge_attr).relu()
