"""DGCNN's edge convolution (EdgeConv)."""

from __future__ import annotations

import torch

from ..checks import check_features
from ..message import MessagePassing
from ..rows import rows_io


class EdgeConv(MessagePassing):
    """Wang et al.'s edge convolution (DGCNN):

        y_v = aggr_{u→v} nn([x_v, x_u - x_v])

    on MessagePassing.

    Args:
        nn: a module of the concatenated pair [E, 2C] -> [E, C'].
        aggr: 'max' (default), 'min', 'mean' or 'sum' ('add').

    Shapes:
        input: x [n, C], g the job's DistGraph
        output: [n, C']
    """

    def __init__(self, nn: torch.nn.Module, aggr: str = "max", **kwargs):
        super().__init__(aggr=aggr, **kwargs)
        self.nn = nn

    def reset_parameters(self) -> None:
        for m in self.nn.modules():
            if m is not self.nn and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    @rows_io
    def forward(self, x, g) -> torch.Tensor:
        check_features(x, g, "EdgeConv")
        return self.propagate(self.edges(g), x=x)

    def message(self, x_i, x_j):
        return self.nn(torch.cat([x_i, x_j - x_i], dim=-1))
