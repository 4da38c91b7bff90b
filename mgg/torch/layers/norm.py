"""Batch normalization whose statistics span every rank's rows (BatchNorm), and GIN's
MLP built on it."""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InputError
from ..checks import check_features, check_graph, check_rows
from ..collectives import all_reduce
from ..inputs import linear
from ..rows import rows_io
from .base import refuse


class BatchNorm(nn.Module):
    """Batch normalization over the rows of every rank:

        y = (x - μ) / sqrt(σ² + eps) · γ + β

    μ and σ² reduced across the ranks, so P ranks compute what one process does; in
    evaluation with ``track_running_stats``, the running statistics. The parameters and
    buffers of torch.nn.BatchNorm1d.

    Args:
        num_features: C, the rows' width.
        eps: added to σ².
        momentum: the running statistics' update rate.
        affine: learn γ (``weight``) and β (``bias``).
        track_running_stats: keep running statistics, and evaluate with them.
        allow_single_element: a graph of one node normalizes instead of refusing.
        mode: 'node' (PyG's others are refused).

    Shapes:
        input: x [n, C] (bf16 x: the statistics in float32), g the job's DistGraph (Rows
            x bring theirs)
        output: [n, C] in x's dtype
    """

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
            refuse("BatchNorm", f"mode={mode!r}: mgg normalizes over the nodes ('node')")
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
                raise InputError(f"batch normalization needs at least 2 rows, got {count}")
            if g.size == 1 and count > 1:  # torch's kernel: one autograd node, not 20
                return _alone(self, x).to(rows.dtype)
            mean, var = batch_statistics(self, x, g)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y.to(rows.dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if not self.track_running_stats:  # a state written while it tracked them
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                state_dict.pop(prefix + k, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def batch_statistics(norm: nn.Module, x: torch.Tensor, g) -> tuple:
    """(μ, σ²) [C] of this rank's rows x [n, C] over every rank's rows; in training, the
    running statistics of ``norm`` (a BatchNorm: torch's or mgg's) updated with them as
    torch does (σ² unbiased; momentum None: the cumulative average). One allreduce (and
    one in the backward pass): each rank's n·μ_r and n·(σ_r² + μ_r²), in float64, so
    that σ² = E[x²] - μ² keeps float32's precision while |μ| < 10⁴ σ."""
    count, n = g.plan.num_nodes, x.shape[0]
    if n:
        var_r, mean_r = (s.double() for s in torch.var_mean(x, 0, correction=0))
        local = torch.cat([mean_r * n, (var_r + mean_r * mean_r) * n])
    else:  # no rows: zeros, still in the graph, so that its backward joins the allreduce
        local = torch.cat([x.sum(0), x.sum(0)]).double()
    s1, s2 = (all_reduce(local, g) / count).chunk(2)
    mean, var = s1.to(x.dtype), (s2 - s1 * s1).clamp_min(0).to(x.dtype)
    if norm.track_running_stats and norm.training:
        with torch.no_grad():
            m = _momentum(norm)
            norm.running_mean.mul_(1 - m).add_(m * mean)
            norm.running_var.mul_(1 - m).add_(m * var * count / max(count - 1, 1))
    return mean, var


def _momentum(norm: nn.Module) -> float:
    """This training step's update rate of the running statistics, counted as torch does."""
    norm.num_batches_tracked += 1
    return norm.momentum if norm.momentum is not None else 1 / int(norm.num_batches_tracked)


def _alone(norm: BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """One rank's batch normalization in training: torch's own kernel."""
    track = norm.track_running_stats
    m = 0.0
    if track:
        with torch.no_grad():
            m = _momentum(norm)
    return F.batch_norm(
        x,
        norm.running_mean if track else None,
        norm.running_var if track else None,
        norm.weight,
        norm.bias,
        True,
        m,
        norm.eps,
    )


class MLP(nn.Module):
    """GIN's MLP over ``channels`` [c₀, c₁, ..., c_k]:

        Linear → [BatchNorm] → ReLU → ... → Linear

    its norms mgg's BatchNorm, whose statistics span every rank.

    Args:
        channels: the widths, input first, output last (at least two).
        batch_norm: a BatchNorm after each hidden Linear.
        running_stats: the norms keep running statistics (False: they evaluate with the
            statistics of the rows they get, as they train).

    Shapes:
        input: x [n, c₀], g the job's DistGraph; ``first_done``: x already went through
            the first Linear ([n, c₁], GINConv's order)
        output: [n, c_k]
    """

    def __init__(self, channels: list[int], batch_norm: bool = True, running_stats: bool = True):
        super().__init__()
        if len(channels) < 2:
            raise InputError(f"an MLP needs at least [in, out] channels, got {channels}")
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(channels))
        self.norms = nn.ModuleList(
            BatchNorm(c, track_running_stats=running_stats) if batch_norm else nn.Identity()
            for c in channels[1:-1]
        )

    @rows_io
    def forward(self, x, g=None, first_done: bool = False) -> torch.Tensor:
        """``first_done``: x already went through the first Linear (GINConv's order)."""
        first = self.lins[0]
        check_features(x, g, "MLP", first.out_features if first_done else first.in_features)
        for i, lin in enumerate(self.lins):
            if i > 0 or not first_done:
                x = linear(x, lin.weight, lin.bias)
            if i < len(self.norms):
                norm = self.norms[i]
                x = F.relu(norm(x, g) if isinstance(norm, BatchNorm) else x)
        return x
