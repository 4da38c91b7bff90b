"""What runs inside a distributed PyG layer (mgg.pyg.convs) besides PyG's own code: a
torch function mode for the ops whose meaning spans the ranks, and torch's BatchNorm1d
with every rank's statistics."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import InputError
from ..torch.dropouts import dropout
from ..torch.edges import EdgeIndex
from ..torch.layers.norm import batch_statistics
from ..torch.reductions import WHOLE, dispatch
from ..torch.rows import follow_torch_seed, plain

_GRAPH: list = []  # the graph of the distributed layers running (innermost last)


@contextlib.contextmanager
def inside(g):
    """While a distributed layer of the job of ``g`` runs (the outermost one sets the
    mode: InLayer)."""
    mode = InLayer(g) if not _GRAPH else contextlib.nullcontext()
    _GRAPH.append(g)
    try:
        with mode:
            yield
    finally:
        _GRAPH.pop()


_T = torch.Tensor
_SHAPES = {_T.view, _T.reshape}


class InLayer(TorchFunctionMode):
    """The ops of a distributed layer whose meaning spans the ranks:

    - F.dropout of node rows (this rank's n rows in dim 0, or in dim 1 of [K, n, C]: PyG's
      node_dim -2): mgg's rank-invariant masks, keyed by torch's seed too, so P ranks
      drop what one process does;
    - at P > 1, a whole-tensor reduction (one argument, no dim) that Rows cover over
      every rank (mgg.torch.reductions.WHOLE: sum, mean, max, min, norm, logsumexp, ...)
      of a float tensor whose rows are this rank's nodes or edges (ChebConv's largest
      edge weight): over every rank's;
    - at P > 1, PyG's view(-1, ...) of an empty per-edge tensor (a rank without edges).
    Which applies is decided alike on every rank (Space.everywhere)."""

    def __init__(self, g):
        super().__init__()
        self.g, self.space = g, EdgeIndex.of(g).space
        self.sizes = {g.num_local_nodes, EdgeIndex.of(g).shape[1]}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        if self.g.size > 1:
            t = args[0] if len(args) == 1 and not kwargs else None
            # the whole-tensor form is the code's, alike on every rank: then decide together
            if func in WHOLE and t is not None and self.space.everywhere(self._rows(t)):
                return dispatch(func, self.g, (plain(t),), {})
            if func in _SHAPES and args[0].numel() == 0:  # a rank without edges: [0, ...]
                shape = (
                    args[1] if len(args) == 2 and isinstance(args[1], tuple | list) else args[1:]
                )
                if -1 in shape:
                    args = (args[0], *_empty_shape(args[0], list(shape)))
        out = func(*args, **kwargs)
        if isinstance(out, EdgeIndex):
            self.sizes.add(out.shape[1])
        return out

    def _rows(self, t) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and not isinstance(t, torch.nn.Parameter)
            and t.is_floating_point()
            and t.dim() >= 1
            and t.shape[0] in self.sizes
        )

    def _dropout(self, t, p=0.5, training=True, inplace=False):
        n = self.g.num_local_nodes
        nodes = isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1
        on = [nodes and t.shape[0] == n, nodes and t.dim() == 3 and t.shape[1] == n]
        dim = 0 if self.space.everywhere(on[0]) else 1 if self.space.everywhere(on[1]) else None
        if dim is None or not training or p == 0:  # per-edge values: torch's masks
            return F.dropout(t, p, training, inplace)
        follow_torch_seed(self.g)
        rows = plain(t).movedim(dim, 0)
        flat = rows.reshape(n, math.prod(rows.shape[1:]))
        return dropout(flat, self.g, p, training).reshape(rows.shape).movedim(0, dim)


def _empty_shape(t: torch.Tensor, shape: list) -> list:
    """PyG's view(..., -1, ...) of an empty tensor: -1 is 0 unless another dim is, then
    the row width the others leave."""
    i = shape.index(-1)
    others = [d for j, d in enumerate(shape) if j != i]
    if 0 not in others:
        shape[i] = 0
    else:
        shape[i] = math.prod(t.shape[1:]) // max(math.prod(d for d in others if d), 1)
    return shape


class RanksBatchNorm1d(torch.nn.BatchNorm1d):
    """torch's BatchNorm1d inside a distributed layer: in training, the statistics of
    every rank's rows (the running ones updated with them), as one process computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = _GRAPH[-1] if _GRAPH else None
        if g is None or g.size == 1 or not (self.training or not self.track_running_stats):
            return super().forward(x)
        x = plain(x)
        if x.shape[0] != g.num_local_nodes:
            raise InputError(
                f"BatchNorm1d: {x.shape[0]} rows, this rank's nodes are {g.num_local_nodes}"
            )
        mean, var = batch_statistics(self, x, g)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        return y * self.weight + self.bias if self.affine else y


__all__ = ["InLayer", "RanksBatchNorm1d", "inside"]
