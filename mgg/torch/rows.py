"""Rows: this rank's rows of a node tensor [N, ...] that spans every rank, behaving as the
whole tensor where a script looks at the whole (what makes a PyG script run unchanged).

A ``Rows`` is a torch.Tensor of the n = ub - lb rows of this rank, tagged with the job's
DistGraph ``g``. Row-wise work stays on the rank (elementwise ops, ``nn.Linear``,
``argmax(-1)``, masks ``x[mask]``); what reduces over the nodes is global:

- ``F.dropout``: mgg's rank-invariant dropout (P ranks draw one process's masks; the
  step advances at each backward, or at ``g.begin_step``);
- ``F.cross_entropy``, ``F.nll_loss``, ``F.binary_cross_entropy_with_logits``,
  ``F.mse_loss``, ``F.l1_loss``: the loss over every rank's rows (local sum / global
  count: finite on a rank that holds none);
- ``sum``, ``mean``, ``count_nonzero``, ``any``, ``all`` over dim 0 (or all dims), and
  the values of ``max``/``min``/``amax``/``amin``: over every rank. Other reductions over
  the nodes are refused, never computed on this rank's rows alone.

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
from .checks import InputRows, check_graph
from .collectives import GradSync
from .dropouts import dropout
from .edges import EdgeIndex, Tagged

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
        if func in _REDUCTIONS and g is not None and _over_nodes(args, kwargs):
            raise InputError(
                f"{_name(func)} over dim 0 reduces the nodes of every rank, and mgg computes "
                "sum, mean, count_nonzero, any, all and the values of max/min/amax/amin "
                "across ranks: use one of those (or reduce another dim)"
            )
        with torch._C.DisableTorchFunctionSubclass():
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


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _over_nodes(args, kwargs) -> bool:
    """Whether a reduction's dim (second positional or ``dim``) covers dim 0: None does."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], bool) else None)
    if dim is None:
        return True
    x = args[0]
    dims = dim if isinstance(dim, tuple | list) else (dim,)
    return any(int(d) % max(x.ndim, 1) == 0 for d in dims)


# ---- global values and the gradient sync ------------------------------------------------------


class _Global(torch.autograd.Function):
    """The sum over ranks of a local value, the same on every rank; backward: each rank's
    share of the gradient, scaled by P (the sync averages), and the sync queued."""

    @staticmethod
    def forward(ctx, t, g, params):
        ctx.g, ctx.params = g, params
        return _reduced(g, t, "sum")

    @staticmethod
    def backward(ctx, dt):
        GradSync.of(ctx.g).queue(ctx.g, ctx.params)
        return dt * ctx.g.size, None, None


def _reduced(g, t: torch.Tensor, op: str) -> torch.Tensor:
    """t reduced ('sum', 'max', 'min') over the ranks, on the host in float64 (bf16
    included), back in t's dtype and device; a copy of t in a job of one rank."""
    if g.comm is None or g.size == 1:
        return t.detach().clone()
    a = t.detach().to("cpu", torch.float64).reshape(-1).numpy()
    return torch.from_numpy(g.comm.allreduce(a, op)).to(t.device, t.dtype).reshape(t.shape)


def global_value(g, op: str, t: torch.Tensor) -> torch.Tensor:
    """``op`` (sum, mean, max, min, amax, amin) of every element of t, whose rows are this
    rank's share of a tensor split over the ranks (nodes, or edges), over every rank's."""
    if op in ("sum", "mean"):
        s = _global_sum(t.sum(), g)
        return s if op == "sum" else s / _count(g, t.numel()).to(s.dtype)
    if t.requires_grad and torch.is_grad_enabled():
        raise InputError(f"{op} over every rank's rows has no gradient in mgg")
    red = "max" if op in ("max", "amax") else "min"
    empty = float("-inf") if red == "max" else float("inf")
    local = getattr(t, "amax" if red == "max" else "amin")() if t.numel() else t.new_tensor(empty)
    return _reduced(g, local, red)


def _global_sum(t: torch.Tensor, g) -> torch.Tensor:
    """t (a local sum) summed over the ranks; differentiable (see the module's rule)."""
    params = _parameters_of(t) if t.requires_grad and torch.is_grad_enabled() else ()
    return _Global.apply(t, g, params)


def _parameters_of(t: torch.Tensor) -> tuple:
    """The leaf tensors that require grad which ``t`` depends on, in one walk of its
    autograd graph (the same order on every rank: every rank built the same graph)."""
    seen, out, stack = set(), [], [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            out.append(var)
        stack.extend(f for f, _ in reversed(fn.next_functions))
    return tuple(out)


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

    def __init__(self, model: torch.nn.Module, g):
        super().__init__()
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


def _count(g, n) -> torch.Tensor:
    return _global_sum(torch.tensor([float(n)], dtype=torch.float64), g)[0]


def _reduce(g, total: torch.Tensor, count: torch.Tensor, reduction: str):
    if reduction == "none":
        return Rows.of(total, g)
    total = _global_sum(total, g)
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
        return _reduce(g, total, _count(g, float(count)), reduction)

    return handler


def _element_loss(loss_fn):
    """An elementwise loss (mse, l1, bce with logits) over every rank's entries."""

    def handler(g, input, target, *args, reduction="mean", **kw):
        input, target = plain(input), plain(target)
        if reduction == "none":
            return Rows.of(loss_fn(input, target, *args, reduction="none", **kw), g)
        total = loss_fn(input, target, *args, reduction="sum", **kw)
        return _reduce(g, total, _count(g, input.numel()), reduction)

    return handler


def _dims(args, kwargs):
    """A reduction's (dim, keepdim) from its arguments (dim None: every dim)."""
    dim = kwargs.get("dim", args[0] if args and not isinstance(args[0], bool) else None)
    keep = args[1] if len(args) > 1 and isinstance(args[1], bool) else False
    return dim, kwargs.get("keepdim", keep)


def _summing(op):
    """sum / mean / count_nonzero / any / all: over every rank when dim 0 is reduced."""

    def handler(g, x, *args, **kwargs):
        dim, keepdim = _dims(args, kwargs)
        t = plain(x)
        if dim is not None and not _over_nodes((t, dim), {}):
            with torch._C.DisableTorchFunctionSubclass():
                return Rows.of(_TORCH[op](t, *args, **kwargs), g)
        if op in ("any", "all", "count_nonzero"):
            local = (t != 0) if op != "all" else (t == 0)
            s = local.sum() if dim is None else local.sum(dim=dim, keepdim=keepdim)
            s = _global_sum(s.double(), g)
            if op == "count_nonzero":
                return s.long()
            return s > 0 if op == "any" else s == 0
        dtype = kwargs.get("dtype")
        s = t.sum(dtype=dtype) if dim is None else t.sum(dim=dim, keepdim=keepdim, dtype=dtype)
        if not s.is_floating_point():
            return _global_sum(s.double(), g).to(s.dtype)
        s = _global_sum(s, g)
        if op == "sum":
            return s
        n = t.numel() if dim is None else t.shape[0]
        if dim is not None:
            for d in dim if isinstance(dim, tuple | list) else (dim,):
                if int(d) % t.ndim != 0:
                    n *= t.shape[int(d)]
        return s / _count(g, n).to(s.dtype)

    return handler


def _extreme(op):
    """max / min / amax / amin over every rank: values only, without a gradient."""

    def handler(g, x, *args, **kwargs):
        t = plain(x)
        if (args or "dim" in kwargs) and not _over_nodes((t, *args), kwargs):
            with torch._C.DisableTorchFunctionSubclass():
                return _as_rows(_TORCH[op](t, *args, **kwargs), g)
        if (args or "dim" in kwargs) and op in ("max", "min"):
            raise InputError(
                f"{op}(dim=0) would give indices into one rank's rows: use amax/amin for "
                "the values over every rank"
            )
        if t.requires_grad and torch.is_grad_enabled():
            raise InputError(f"{op} over every rank's rows has no gradient in mgg")
        dim, keepdim = _dims(args, kwargs)
        red = "max" if op in ("max", "amax") else "min"
        local = getattr(t, "amax" if red == "max" else "amin")(
            dim=() if dim is None else dim, keepdim=keepdim
        )
        return _reduced(g, local, red)

    return handler


_TORCH = {
    "sum": torch.sum,
    "mean": torch.mean,
    "count_nonzero": torch.count_nonzero,
    "any": torch.any,
    "all": torch.all,
    "max": torch.max,
    "min": torch.min,
    "amax": torch.amax,
    "amin": torch.amin,
}
_HANDLERS = {
    F.dropout: _dropout,
    F.cross_entropy: _class_loss(F.cross_entropy),
    F.nll_loss: _class_loss(F.nll_loss),
    F.binary_cross_entropy_with_logits: _element_loss(F.binary_cross_entropy_with_logits),
    F.mse_loss: _element_loss(F.mse_loss),
    F.l1_loss: _element_loss(F.l1_loss),
}
for _op in ("sum", "mean", "count_nonzero", "any", "all"):
    _HANDLERS[getattr(torch, _op)] = _HANDLERS[getattr(torch.Tensor, _op)] = _summing(_op)
for _op in ("max", "min", "amax", "amin"):
    _HANDLERS[getattr(torch, _op)] = _HANDLERS[getattr(torch.Tensor, _op)] = _extreme(_op)
_REDUCTIONS = {
    f
    for name in ("argmax", "argmin", "std", "var", "prod", "norm", "median", "sort", "topk")
    for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None))
    if f is not None
}


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
