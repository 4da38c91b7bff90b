"""Reductions over the nodes of Rows (mgg.torch.rows): which torch ops mgg computes over
every rank's rows, which it refuses, and which stay on the rank, held as data (the
tables below: docs/pyg.md's list is ``doc()``), with the handlers of the covered ones.

An op reduces over the nodes when its dim covers dim 0 (0, -ndim, a tuple holding one of
them, or no dim where the op then reduces every dim). Such an op on Rows is

- covered (``COVERED``): computed over every rank's rows, the same value on every rank;
  where torch has a gradient, the sums keep it (a global sum's backward sends each rank
  its share, scaled by P, and the parameters' gradients are averaged when the backward
  pass ends: mgg.torch.rows);
- refused (``REFUSED``): mgg's InputError naming the op, never this rank's result;
- on the rank, computed as torch does (``ON_THE_RANK``): ops that take a dim but reduce
  no node into another (cat, gather, index_select, split, transpose, ...).

An op in none of the tables reduces nothing (elementwise ops, matmul, ...) unless it is
given ``dim=`` covering dim 0, which is refused: a new reduction of torch cannot silently
cover one rank. tests/test_rows_misuse.py walks torch's overridable functions and fails
on one that takes a dim and is in no table. Whole-tensor reductions are the same list
inside a distributed PyG layer (mgg.pyg.inside).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError
from .collectives import GradSync

ON_RANK = object()  # a handler's answer: the op covers no node of another row

# ---- the tables --------------------------------------------------------------------------------
# A name is torch.NAME and torch.Tensor.NAME; 'F.NAME' torch.nn.functional's; 'linalg.',
# 'special.', 'fft.' torch's namespaces. A dim spec is (position of the dim among the
# arguments, its keyword, its default): None reduces every dim, ALL is an op without a dim
# that reads every element, IMPLICIT F.softmax's legacy dim.
ALL, IMPLICIT = "all", "implicit"
_SUM = (1, "dim", None)

# (names, what docs/pyg.md says of them); the handler of each is _HANDLERS[name]
COVERED = [
    (("sum", "nansum", "mean", "nanmean", "logsumexp", "special.logsumexp"), "with gradients"),
    (("count_nonzero", "any", "all"), ""),
    (
        ("norm", "linalg.vector_norm", "linalg.norm", "linalg.matrix_norm", "dist"),
        "vector p-norms and the Frobenius norm, with gradients (p = ±inf: values only); "
        "matrix norms other than 'fro' are refused",
    ),
    (
        ("max", "min", "amax", "amin", "aminmax", "prod"),
        "values only, without a gradient; `max(0)` and `min(0)` (indices) are refused",
    ),
]

# the losses over every rank's rows (their handlers: mgg.torch.rows): 'class' weighs each
# row by its class's weight, without ignore_index's; 'mean' is the mean of the values of
# torch's reduction='none' over every rank ('batchmean': kl_div's sum over the rows)
LOSSES = {
    "F.cross_entropy": "class",
    "F.nll_loss": "class",
    **dict.fromkeys(
        (
            *("F.mse_loss", "F.l1_loss", "F.binary_cross_entropy_with_logits"),
            *("F.binary_cross_entropy", "F.smooth_l1_loss", "F.huber_loss", "F.kl_div"),
            *("F.soft_margin_loss", "F.poisson_nll_loss", "F.gaussian_nll_loss"),
            *("F.hinge_embedding_loss", "F.margin_ranking_loss", "F.cosine_embedding_loss"),
            *("F.multilabel_margin_loss", "F.multilabel_soft_margin_loss"),
            *("F.multi_margin_loss", "F.triplet_margin_loss"),
            "F.triplet_margin_with_distance_loss",
        ),
        "mean",
    ),
}

_LAST = (1, "dim", -1)
_EVERY = (None, "", ALL)  # an op without a dim that reads every element
_1D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
REFUSED_KINDS = [  # (kind, {name: dim spec})
    (
        "indices or order statistics of the nodes",
        {
            **dict.fromkeys(("argmax", "argmin", "median", "nanmedian"), _SUM),
            **dict.fromkeys(("mode", "sort", "argsort"), _LAST),
            **dict.fromkeys(("kthvalue", "topk"), (2, "dim", -1)),
            **dict.fromkeys(("quantile", "nanquantile"), (2, "dim", None)),
            **dict.fromkeys(("msort", "unique", "unique_consecutive"), _EVERY),
        },
    ),
    (
        "moments mgg does not compute over ranks",
        {
            **dict.fromkeys(("std", "var", "std_mean", "var_mean", "frobenius_norm"), _SUM),
            **dict.fromkeys(("cov", "corrcoef", "nuclear_norm"), _EVERY),
            "native_norm": (2, "dim", None),
            "hash_tensor": _SUM,
        },
    ),
    (
        "scans, differences and shifts along the nodes",
        {
            **dict.fromkeys(("cumsum", "cumsum_", "cumprod", "cumprod_", "cummax"), _SUM),
            **dict.fromkeys(("cummin", "logcumsumexp"), _SUM),
            **dict.fromkeys(("trapezoid", "trapz", "cumulative_trapezoid"), (None, "dim", -1)),
            **dict.fromkeys(("renorm", "renorm_"), _EVERY),
            "diff": (2, "dim", -1),
            "gradient": (None, "dim", None),
            "flip": (1, "dims", None),
            "roll": (2, "dims", None),
            "rot90": (2, "dims", (0, 1)),
        },
    ),
    ("losses over sequences", {"F.ctc_loss": _EVERY}),
    ("counts of values", dict.fromkeys(("bincount", "histc", "histogram", "histogramdd"), _EVERY)),
    (
        "normalizations over a dim",
        {
            **dict.fromkeys(("softmax", "log_softmax", "special.softmax"), _SUM),
            "special.log_softmax": _SUM,
            **dict.fromkeys(("F.softmax", "F.log_softmax", "F.softmin"), (1, "dim", IMPLICIT)),
            **dict.fromkeys(("F.normalize", "F.cosine_similarity"), (2, "dim", 1)),
            "F.gumbel_softmax": (4, "dim", -1),
            "F.glu": (1, "dim", -1),
            "linalg.vecdot": (None, "dim", -1),
            "segment_reduce": (5, "axis", 0),
            "F.batch_norm": (5, "training", False),  # in training: the batch's statistics
        },
    ),
    (
        "Fourier transforms along the nodes",
        {
            **{f"fft.{n}": (2, "dim", -1) for n in _1D},
            **{f"fft.{n}2": (2, "dim", (-2, -1)) for n in _1D},
            **{f"fft.{n}n": (2, "dim", None) for n in _1D},
            **dict.fromkeys(("fft.fftshift", "fft.ifftshift"), (1, "dim", None)),
        },
    ),
]
REFUSED = {name: spec for _, table in REFUSED_KINDS for name, spec in table.items()}
_HINTS = {
    "argmax": "indices into one rank's rows; argmax(-1) per row stays on the rank",
    "argmin": "indices into one rank's rows; argmin(-1) per row stays on the rank",
    "F.batch_norm": "use mgg.torch.BatchNorm, whose statistics span every rank",
}

ON_THE_RANK = (
    *("cat", "concat", "concatenate", "stack", "chunk", "split", "split_with_sizes"),
    *("tensor_split", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "split_copy"),
    *("split_with_sizes_copy", "narrow", "narrow_copy", "select", "select_copy"),
    *("select_scatter", "slice_copy", "slice_inverse", "slice_scatter", "index_select"),
    *("index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_"),
    *("index_reduce", "index_reduce_", "gather", "scatter", "scatter_", "scatter_add"),
    *("scatter_add_", "scatter_reduce", "scatter_reduce_", "take_along_dim", "squeeze"),
    *("squeeze_", "squeeze_copy", "unsqueeze", "unsqueeze_", "unsqueeze_copy", "flatten"),
    *("unflatten", "permute", "permute_copy", "transpose", "transpose_", "transpose_copy"),
    *("swapaxes", "swapaxes_", "movedim", "moveaxis", "repeat_interleave", "tile", "unbind"),
    *("unbind_copy", "cross", "linalg.cross", "size", "stride", "tensordot"),
    *("linalg.tensorsolve", "norm_except_dim", "fake_quantize_per_channel_affine"),
    *("quantize_per_channel", "F.max_pool1d", "F.max_pool2d", "F.max_pool3d"),
    *("F.adaptive_max_pool1d", "F.adaptive_max_pool2d", "F.adaptive_max_pool3d"),
    *("F.fractional_max_pool2d", "F.fractional_max_pool3d"),
)


def functions(name: str) -> list:
    """The torch functions (and Tensor methods) a table's name stands for."""
    space, _, base = name.rpartition(".")
    homes = (torch, torch.Tensor) if not space else (F,) if space == "F" else ()
    homes = homes or (getattr(torch, space, None),)  # torch.linalg, torch.special, torch.fft
    return [getattr(m, base) for m in homes if hasattr(m, base)]


def doc() -> str:
    """docs/pyg.md's list of reductions over the nodes (tests/test_rows_misuse.py holds
    the two equal): ``python -m mgg.torch.reductions`` prints it."""

    def names(ns):
        return ", ".join(f"`{n}`" + (" (in training)" if n == "F.batch_norm" else "") for n in ns)

    lines = ["  - Reductions over the nodes (dim 0, or every dim) cover every rank:"]
    for ns, note in COVERED:
        lines.append(f"    - {names(ns)}" + (f": {note};" if note else ";"))
    lines += [
        f"    - the losses {names(LOSSES)}, with their `reduction` (`'none'`: this rank's "
        "rows as Rows; `kl_div`'s `'batchmean'`: over every rank's rows).",
        "  - Refused over the nodes with an `InputError` naming the op, never computed on "
        "one rank's rows alone:",
        *(f"    - {kind}: {names(sorted(table))};" for kind, table in REFUSED_KINDS),
        "  - An op in neither list given `dim=` that covers dim 0 is refused too, so a "
        "new torch reduction cannot quietly cover one rank. Inside a distributed PyG "
        "layer at P > 1, the covered ones but `count_nonzero`, `any` and `all`, called on a "
        "whole float tensor of node or edge rows, cover every rank too.",
    ]
    return "\n".join(lines) + "\n"


# ---- reading an op's dim -------------------------------------------------------------------


def _dim(spec, args, kwargs):
    pos, key, default = spec
    if key in kwargs:
        return kwargs[key]
    if pos is not None and len(args) > pos:
        return args[pos]
    return default


def covers(x: torch.Tensor, dim) -> bool:
    """Whether ``dim`` (an int, a tuple, None: every dim) of ``x`` covers dim 0."""
    if isinstance(dim, str):
        if dim != IMPLICIT:
            return True
        dim = 0 if x.ndim in (0, 1, 3) else 1
    if dim is None:
        return True
    dims = tuple(dim) if isinstance(dim, tuple | list) else (dim,)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return False  # not a dim: max(x, other) and the like are elementwise
    return not dims or any(d % max(x.ndim, 1) == 0 for d in dims)


def _dims(x: torch.Tensor, dim) -> tuple:
    """``dim`` as a sorted tuple of dims of x (None or (): every dim)."""
    if dim is None:
        return tuple(range(x.ndim))
    dims = tuple(dim) if isinstance(dim, tuple | list) else (dim,)
    return tuple(sorted({d % max(x.ndim, 1) for d in dims})) if dims else tuple(range(x.ndim))


def _shape(x: torch.Tensor, dims: tuple, keep: bool) -> list:
    return [1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims]


def _local(op, x: torch.Tensor, dims: tuple, keep: bool, **kw) -> torch.Tensor:
    """op (torch.sum, torch.nansum) of x over ``dims``."""
    if len(dims) == x.ndim:
        return op(x, **kw).reshape(_shape(x, dims, keep))
    return op(x, dim=dims, keepdim=keep, **kw)


def _plain(t):
    if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
        return t.as_subclass(torch.Tensor)
    return t


# ---- global values and sums ----------------------------------------------------------------


class _Global(torch.autograd.Function):
    """The sum over ranks of a local value, the same on every rank; backward: each rank's
    share of the gradient, scaled by P (the sync averages), and the sync queued."""

    @staticmethod
    def forward(ctx, t, g, params):
        ctx.g, ctx.params = g, params
        return reduced(g, t, "sum")

    @staticmethod
    def backward(ctx, dt):
        GradSync.of(ctx.g).queue(ctx.g, ctx.params)
        return dt * ctx.g.size, None, None


def reduced(g, t: torch.Tensor, op: str) -> torch.Tensor:
    """t reduced ('sum', 'max', 'min') over the ranks, on the host in float64 (bf16
    included), back in t's dtype and device; a copy of t in a job of one rank."""
    if g.comm is None or g.size == 1:
        return t.detach().clone()
    a = t.detach().to("cpu", torch.float64).reshape(-1).numpy()
    return torch.from_numpy(g.comm.allreduce(a, op)).to(t.device, t.dtype).reshape(t.shape)


def global_sum(t: torch.Tensor, g) -> torch.Tensor:
    """t (a local sum) summed over the ranks; differentiable (see mgg.torch.rows's rule);
    an integer t exactly below 2**53."""
    if not (t.is_floating_point() or t.is_complex()):
        return reduced(g, t.double(), "sum").to(t.dtype)
    params = _parameters_of(t) if t.requires_grad and torch.is_grad_enabled() else ()
    return _Global.apply(t, g, params)


def count(g, n) -> torch.Tensor:
    """n (this rank's count) summed over the ranks, a float64 scalar."""
    return global_sum(torch.tensor([float(n)], dtype=torch.float64), g)[0]


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


def _no_grad(name: str, t: torch.Tensor) -> None:
    if t.requires_grad and torch.is_grad_enabled():
        raise InputError(
            f"{name} over every rank's rows has no gradient in mgg: take it of x.detach(), "
            "or use a sum, mean, logsumexp or p-norm"
        )


def _extreme(g, x: torch.Tensor, dims: tuple, keep: bool, red: str) -> torch.Tensor:
    """The max or min of x over ``dims`` over every rank (a rank without rows adds none)."""
    if x.numel():
        local = (torch.amax if red == "max" else torch.amin)(x, dim=dims, keepdim=keep)
        return reduced(g, local, red)
    fill = -math.inf if red == "max" else math.inf  # float64 holds every dtype's extremes
    local = torch.full(_shape(x, dims, keep), fill, dtype=torch.float64, device=x.device)
    return reduced(g, local, red).to(x.dtype)


def global_value(g, op: str, t: torch.Tensor) -> torch.Tensor:
    """``op`` (a COVERED name) of every element of t, whose rows are this rank's share of
    a tensor split over the ranks (nodes, or edges), over every rank's."""
    return _HANDLERS[op](op, g, (t,), {})


# ---- the covered ops ---------------------------------------------------------------------------


def _keep(args, kwargs, pos=2) -> bool:
    return bool(kwargs.get("keepdim", args[pos] if len(args) > pos else False))


def _sums(name, g, args, kwargs):
    x, d = args[0], _dim(_SUM, args, kwargs)
    if not covers(x, d):
        return ON_RANK
    dims, keep, dtype = _dims(x, d), _keep(args, kwargs), kwargs.get("dtype")
    if name in ("mean", "nanmean") and not (dtype or x.dtype).is_floating_point:
        raise InputError(f"{name} of {x.dtype} rows: give dtype= a floating type, as torch asks")
    nan = x.isnan() if name.startswith("nan") else None
    if nan is not None:  # torch's nansum: NaNs count as 0, their gradient 0
        x = torch.where(nan, torch.zeros_like(x), x)
    s = global_sum(_local(torch.sum, x, dims, keep, dtype=dtype), g)
    if name in ("sum", "nansum"):
        return s
    if name == "mean":
        return s / count(g, math.prod(x.shape[i] for i in dims)).to(s.dtype)
    n = reduced(g, _local(torch.sum, ~nan, dims, keep).double(), "sum")
    return s / n.to(s.dtype)


def _logical(name, g, args, kwargs):
    x, d = args[0], _dim(_SUM, args, kwargs)
    if not covers(x, d):
        return ON_RANK
    dims, keep = _dims(x, d), name != "count_nonzero" and _keep(args, kwargs)
    n = global_sum(_local(torch.sum, (x == 0) if name == "all" else (x != 0), dims, keep), g)
    return n if name == "count_nonzero" else n > 0 if name == "any" else n == 0


def _logsumexp(name, g, args, kwargs):
    x, d = args[0], _dim(_SUM, args, kwargs)
    if not covers(x, d):
        return ON_RANK
    if not x.is_floating_point():
        x = x.float()
    dims, keep = _dims(x, d), _keep(args, kwargs)
    m = _extreme(g, x.detach(), dims, True, "max")
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    out = m + global_sum(_local(torch.sum, (x - m).exp(), dims, True), g).log()
    return out if keep else out.reshape(_shape(x, dims, False))


def _extremes(name, g, args, kwargs):
    x = args[0]
    if name in ("max", "min"):
        if "other" in kwargs or (len(args) > 1 and isinstance(args[1], torch.Tensor)):
            return ON_RANK  # elementwise
        if len(args) > 1 or "dim" in kwargs:
            if not covers(x, _dim(_SUM, args, kwargs)):
                return ON_RANK
            raise InputError(
                f"{name}(dim=0) of Rows would give indices into one rank's rows: use "
                f"a{name} for the values over every rank"
            )
    d = kwargs.get("dim", args[1] if len(args) > 1 and name != "aminmax" else None)
    if not covers(x, d):
        return ON_RANK
    _no_grad(name, x)
    dims, keep = _dims(x, d), _keep(args, kwargs)
    if name == "aminmax":
        return _extreme(g, x, dims, keep, "min"), _extreme(g, x, dims, keep, "max")
    if name == "prod":
        local = x if kwargs.get("dtype") is None else x.to(kwargs["dtype"])
        for d in reversed(dims):
            local = local.prod(d, keepdim=keep)
        if g.comm is None or g.size == 1:
            return local.clone()
        parts = g.comm.allgather(local.to("cpu", torch.float64).numpy())
        total = np.asarray(np.prod(np.stack(parts), axis=0))
        return torch.from_numpy(total).to(local.device, local.dtype)
    return _extreme(g, x, dims, keep, "max" if name in ("max", "amax") else "min")


_P_DEFAULT = {"norm": "fro", "linalg.vector_norm": 2, "linalg.norm": None}


def _norms(name, g, args, kwargs):
    x = args[0]
    if name == "dist":
        x = x - _plain(args[1] if len(args) > 1 else kwargs["other"])
        return _p_norm(g, x, kwargs.get("p", args[2] if len(args) > 2 else 2), None, False)
    key = "ord" if name.startswith("linalg.") else "p"
    p = kwargs.get(key, args[1] if len(args) > 1 else _P_DEFAULT.get(name, "fro"))
    pair = (-2, -1) if name == "linalg.matrix_norm" else None
    d = kwargs.get("dim", args[2] if len(args) > 2 else pair)
    if not covers(x, d):
        return ON_RANK
    matrix = name == "linalg.matrix_norm" or (
        name in ("linalg.norm", "norm")
        and p is not None
        and ((d is None and x.ndim == 2 and name == "linalg.norm") or _pair(d))
    )
    if p == "nuc" or (matrix and p not in ("fro", None)):
        raise InputError(
            f"{name}(ord={p!r}) over the nodes would take one rank's rows as the matrix: "
            "mgg covers the vector p-norms and 'fro' over every rank"
        )
    dtype = kwargs.get("dtype")
    x = x.to(dtype) if dtype is not None else x
    return _p_norm(g, x, 2 if p in (None, "fro") else p, d, _keep(args, kwargs, 3))


def _pair(d) -> bool:
    return isinstance(d, tuple | list) and len(d) == 2


def _p_norm(g, x, p, d, keep):
    p, dims = float(p), _dims(x, d)
    if not (x.is_floating_point() or x.is_complex()):
        x = x.float()
    a = x.abs()
    if p in (math.inf, -math.inf):
        _no_grad(f"the {p} norm", x)
        return _extreme(g, a, dims, keep, "max" if p > 0 else "min")
    if p == 0:
        return global_sum(_local(torch.sum, (a != 0).to(a.dtype), dims, keep), g)
    return global_sum(_local(torch.sum, a**p, dims, keep), g) ** (1 / p)


_LOGICAL = ("count_nonzero", "any", "all")
_HANDLERS = {
    **dict.fromkeys(("sum", "nansum", "mean", "nanmean"), _sums),
    **dict.fromkeys(_LOGICAL, _logical),
    **dict.fromkeys(("logsumexp", "special.logsumexp"), _logsumexp),
    **dict.fromkeys(("max", "min", "amax", "amin", "aminmax", "prod"), _extremes),
    **dict.fromkeys(("norm", "linalg.vector_norm", "linalg.norm", "linalg.matrix_norm"), _norms),
    "dist": _norms,
}
assert set(_HANDLERS) == {n for ns, _ in COVERED for n in ns}


def _refuse(name, spec, args, kwargs):
    if name == "F.batch_norm":
        if not _dim(spec, args, kwargs):
            return ON_RANK
    elif not covers(args[0], _dim(spec, args, kwargs)):
        return ON_RANK
    return refusal(name)


def refusal(name: str) -> InputError:
    hint = _HINTS.get(
        name, "reduce another dim, or call it on mgg.torch.rows.plain(x) for this rank's own rows"
    )
    return InputError(
        f"{name} over dim 0 reduces the nodes of every rank, and on Rows it would cover one "
        f"rank's rows only: mgg covers sums, means, norms, logsumexp, extremes and the "
        f"losses over every rank (docs/pyg.md); {hint}"
    )


# ---- dispatch ------------------------------------------------------------------------------------

_BY_FUNCTION: dict = {}
for _name, _h in _HANDLERS.items():
    for _f in functions(_name):
        _BY_FUNCTION[_f] = (_name, _h)
for _name, _spec in REFUSED.items():
    for _f in functions(_name):
        _BY_FUNCTION[_f] = (_name, _spec)
ON_THE_RANK_FUNCTIONS = frozenset(f for n in ON_THE_RANK for f in functions(n))
# covered over a whole float tensor inside a PyG layer (mgg.pyg.inside): the float ones
WHOLE = frozenset(f for n in _HANDLERS if n not in _LOGICAL for f in functions(n))


def dispatch(func, g, args, kwargs):
    """``func(*args, **kwargs)`` (args plain tensors, this rank's rows first) over every
    rank's rows where it reduces over the nodes; ON_RANK where it does not; InputError
    where mgg refuses it."""
    entry = _BY_FUNCTION.get(func)
    if entry is None:
        if "dim" in kwargs and func not in ON_THE_RANK_FUNCTIONS and args:
            x = args[0]
            if isinstance(x, torch.Tensor) and covers(x, kwargs["dim"]):
                raise InputError(
                    f"{getattr(func, '__name__', func)}(dim={kwargs['dim']}) of Rows is not "
                    "known to mgg to cover every rank's rows, and would cover one rank's: "
                    "refused (docs/pyg.md lists what mgg covers)"
                )
        return ON_RANK
    name, how = entry
    if callable(how):
        return how(name, g, args, kwargs)
    err = _refuse(name, how, args, kwargs)
    if err is ON_RANK:
        return ON_RANK
    raise err


_BEGIN, _END = "<!-- reductions:", "  <!-- /reductions -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "pyg.md"


def documented(text: str) -> str:
    """The block of docs/pyg.md (its text) between the reductions markers."""
    head, _, rest = text.partition(_BEGIN)
    return rest.partition("-->\n")[2].partition(_END)[0]


def write_doc(path: Path = DOC) -> None:
    """Rewrite the reductions block of docs/pyg.md with ``doc()``."""
    text = path.read_text()
    old = documented(text)
    start = text.index(_BEGIN)
    start = text.index("-->\n", start) + 4
    path.write_text(text[:start] + doc() + text[start + len(old) :])


if __name__ == "__main__":
    import sys

    write_doc() if "--write" in sys.argv[1:] else print(doc(), end="")
