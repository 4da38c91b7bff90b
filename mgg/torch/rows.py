"""Rows: this rank's rows of a node tensor [N, ...] that spans every rank, behaving as the
whole tensor where a script looks at the whole (what makes a PyG script run unchanged).

A ``Rows`` is a torch.Tensor of the n = ub - lb rows of this rank, tagged with the job's
DistGraph ``g``. Row-wise work stays on the rank (elementwise ops, ``nn.Linear``,
``argmax(-1)``, masks ``x[mask]``); what reduces over the nodes is global:

- ``F.dropout``: mgg's rank-invariant dropout (P ranks draw one process's masks; the
  step advances at each backward, or at ``g.begin_step``);
- the losses (mgg.torch.reductions.LOSSES: ``F.cross_entropy``, ``F.nll_loss``,
  ``F.mse_loss``, ... every loss of torch.nn.functional with a reduction but CTC's): the
  loss over every rank's rows (local sum / global count: finite on a rank that holds
  none);
- the other reductions over the nodes (dim 0, or every dim): over every rank where
  mgg.torch.reductions's table covers them (sums, means, norms, logsumexp, extremes),
  else refused, never computed on this rank's rows alone.

Gradients: a global value is the same on every rank, and its backward sends each rank's
share back scaled by P; when the backward pass ends, the gradients of the parameters it
reached are averaged over the ranks (DistributedDataParallel's rule), so ``loss.backward();
optimizer.step()`` takes the same step on every rank, and a term every rank adds alike
(a regularizer) counts once. ``DistributedModel`` does the same for a model whose loss is
the user's own.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import InputError
from ..hashing import key64
from .checks import ArgumentTypeError, InputRows, check_graph
from .collectives import GradSync
from .dropouts import dropout
from .edges import EdgeIndex, Tagged
from .reductions import LOSSES, ON_RANK, dispatch, functions, global_sum, global_value
from .reductions import count as global_count

# ---- the tensor -----------------------------------------------------------------------------


class Rows(torch.Tensor):
    """This rank's rows [n, ...] of a node tensor [N, ...] of the job of ``g``."""

    g = None

    @staticmethod
    def of(t: torch.Tensor, g) -> Rows:
        """``t`` [n, ...] (this rank's rows) as Rows of ``g`` (no copy; autograd kept)."""
        check_graph(g, "Rows")
        if isinstance(t, Rows):
            t = plain(t)
        r = t.as_subclass(Rows)
        r.g = g
        return r

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if any(issubclass(t, Tagged) for t in types):
            return NotImplemented  # edge_index's ops: mgg.torch.edges gives them their meaning
        kwargs = kwargs or {}
        g = _graph_of(args, kwargs)
        handler = _HANDLERS.get(func)
        if handler is not None and g is not None:
            return handler(g, *args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            if g is not None:
                out = dispatch(func, g, args, kwargs)  # over the nodes: every rank, or refused
                if out is not ON_RANK:
                    return out
            out = func(*args, **kwargs)
        return out if g is None else _as_rows(out, g)

    def __repr__(self, **kw):
        return f"Rows(rank {self.g.rank if self.g else '?'}: {plain(self)!r})"


def plain(t):
    """A Rows as the torch.Tensor of its rows (no copy; autograd kept); others as given."""
    if isinstance(t, Rows):
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def _as_rows(out, g):
    """The plain tensors in ``out`` (a tensor, or a tuple of them) as Rows of ``g``."""
    return tree_map(lambda t: Rows.of(t, g) if type(t) is torch.Tensor else t, out)


def _graph_of(args, kwargs):
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, Rows) or (isinstance(a, InputRows) and a.g is not None):
            return a.g
    return None


class _Synced(torch.autograd.Function):
    """Identity whose backward queues the sync of a model's parameters."""

    @staticmethod
    def forward(ctx, t, g, params):
        ctx.g, ctx.params = g, params
        return t.view_as(t)

    @staticmethod
    def backward(ctx, dt):
        GradSync.of(ctx.g).queue(ctx.g, ctx.params)
        return dt, None, None


class DistributedModel(torch.nn.Module):
    """``model`` whose gradients are averaged over the ranks at the end of each backward
    pass (DistributedDataParallel's contract), whatever the loss: a plain ``loss.backward();
    optimizer.step()`` is then the same step on every rank. ``forward(x, g, ...)`` is the
    model's; its tensor outputs come back as Rows."""

    def __init__(self, model: torch.nn.Module, g=None):
        super().__init__()
        if not isinstance(model, torch.nn.Module):
            raise ArgumentTypeError(
                f"DistributedModel: model must be a torch.nn.Module, got {type(model).__name__}"
                " (wrap a function in a Module whose forward calls it)"
            )
        inner = [n for n, m in model.named_modules() if isinstance(m, DistributedModel)]
        if inner:
            where = f"model.{inner[0]}" if inner[0] else "model"
            raise InputError(
                f"DistributedModel: {where} is a DistributedModel already: wrap the outer "
                "model once (a nested one would average the gradients twice and its ranks "
                "would wait on each other's syncs)"
            )
        check_graph(g, "DistributedModel")
        self.module, self.g = model, g

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        params = tuple(p for p in self.module.parameters() if p.requires_grad)
        if not torch.is_grad_enabled() or not params:
            return out

        def sync(t):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return Rows.of(_Synced.apply(plain(t), self.g, params), self.g)
            return t

        return tree_map(sync, out)


# ---- handlers -----------------------------------------------------------------------------------


def _dropout(g, x, p=0.5, training=True, inplace=False):
    follow_torch_seed(g)
    if isinstance(x, InputRows):
        return dropout(x, g, p, training)
    return Rows.of(dropout(plain(x), g, p, training), g)


def follow_torch_seed(g) -> None:
    """Key g's masks by the job's seed and torch's (torch.manual_seed(s), the same on every
    rank of a script, moves mgg's masks as it moves torch's)."""
    k = g.keys
    if k.job_seed is None:
        k.job_seed = k.seed
    k.seed = int(key64(k.job_seed, torch.initial_seed()))


def _reduce(g, total: torch.Tensor, count: torch.Tensor, reduction: str):
    if reduction == "none":
        return Rows.of(total, g)
    total = global_sum(total, g)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return total / count.to(total.dtype)


def _class_loss(loss_fn):
    """cross_entropy and nll_loss over every rank's rows: weighted by ``weight`` of each
    row's class and without the rows of ``ignore_index``, as torch's mean counts them."""

    def handler(g, input, target, weight=None, *args, reduction="mean", **kw):
        input, target = plain(input), plain(target)
        ignore = kw.get("ignore_index", -100)
        if reduction == "none":
            return Rows.of(loss_fn(input, target, weight, *args, reduction="none", **kw), g)
        total = loss_fn(input, target, weight, *args, reduction="sum", **kw)
        if target.is_floating_point():  # class probabilities: one row each
            count = input.shape[0]
        else:
            keep = target != ignore
            count = keep.sum() if weight is None else weight[target[keep]].sum(dtype=torch.float64)
        return _reduce(g, total, global_count(g, float(count)), reduction)

    return handler


def _loss(name, loss_fn):
    """A loss whose mean is the mean of its reduction='none' values (the elementwise
    losses, the per-row ones), over every rank's; kl_div's 'batchmean' over the rows."""

    def handler(g, *args, reduction="mean", **kw):
        if kw.get("size_average") is not None or kw.get("reduce") is not None:
            raise InputError(
                f"{name}: size_average and reduce are torch's old arguments: give reduction="
            )
        if reduction == "batchmean" and name != "F.kl_div":
            raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got 'batchmean'")
        args, kw = tree_map(plain, (args, kw))
        values = loss_fn(*args, reduction="none", **kw)
        if reduction == "none":
            return Rows.of(values, g)
        n = args[0].shape[0] if reduction == "batchmean" else values.numel()
        return _reduce(g, values.sum(), global_count(g, n), reduction.replace("batch", ""))

    return handler


_HANDLERS = {F.dropout: _dropout}
for _name, _how in LOSSES.items():
    _fn = functions(_name)[0]
    _HANDLERS[_fn] = _class_loss(_fn) if _how == "class" else _loss(_name, _fn)


def rows_io(forward):
    """A layer's forward on Rows: its tensors enter as plain rows, and its tensor outputs
    come back as Rows of the input's graph (plain tensors in, plain out). A parameter
    ``g`` left out is the input's graph; PyG's edge_index (mgg.torch.edges.EdgeIndex, a
    PyG script's data.edge_index) in its place is its graph."""
    names = list(inspect.signature(forward).parameters)[1:]

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if any(isinstance(a, EdgeIndex) for a in (*args, *kwargs.values())):
            args, kwargs = _graphs_in(type(self).__name__, args, kwargs)
        g = _graph_of(args, kwargs)
        if g is None:
            return forward(self, *args, **kwargs)
        if "g" in names and names.index("g") >= len(args) and kwargs.get("g") is None:
            kwargs["g"] = g
        args, kwargs = tree_map(plain, (args, kwargs))
        return _as_rows(forward(self, *args, **kwargs), g)

    return wrapper


def _graphs_in(who: str, args, kwargs):
    """PyG's edge_index (data.edge_index) in a layer's arguments as the job's DistGraph."""

    def graph(a):
        return a.graph(who) if isinstance(a, EdgeIndex) else a

    return tuple(map(graph, args)), {k: graph(v) for k, v in kwargs.items()}


__all__ = ["Rows", "DistributedModel", "follow_torch_seed", "global_value", "plain", "rows_io"]
