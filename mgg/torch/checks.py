"""What every op and layer checks first, with errors that name the problem: the graph is
the job's DistGraph, x is this rank's rows (a tensor, or InputRows: input features in a
form no tensor op takes, whose containers are mgg.torch.inputs'), a tensor has the
job's dtype and shape."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..distgraph import DistGraph
from ..errors import ArgumentTypeError, InputError
from ..precision import accumulator, is_bf16, torch_dtype


def _got(t) -> str:
    """What a caller passed, for an error: a tensor's shape and dtype, else its type."""
    if isinstance(t, torch.Tensor | InputRows):
        return f"{type(t).__name__} {tuple(t.shape)} {t.dtype}"
    return type(t).__name__


class InputRows:
    """Input features, which need no gradient: they are only dropped out (``dropout``)
    and multiplied (``linear``), so they may stay in a form no tensor op takes:
    SparseRows (a CSR matrix) or ChunkedRows (dense rows used a chunk at a time;
    HostRows: in host memory, streamed), in mgg.torch.inputs. With the job's DistGraph
    ``g`` they take ``F.dropout`` and ``F.linear`` (``nn.Linear``) as a tensor does,
    giving Rows: a subclass's ``dropout(p, training)`` and ``linear(weight, bias)``."""

    g = None
    what = "input features"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        x, kwargs = args[0], kwargs or {}
        if func is F.linear and x.g is not None:
            return x.linear(*args[1:], **kwargs)
        if func is F.dropout and x.g is not None:
            return x.dropout(*args[1:], **{k: v for k, v in kwargs.items() if k != "inplace"})
        raise ArgumentTypeError(
            f"{getattr(func, '__name__', func)} on {cls.what} ({cls.__name__}): mgg "
            "multiplies them (F.linear, nn.Linear, mgg layers) and drops them out "
            "(F.dropout); x.to_dense() gives a tensor"
        )

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 2

    ndim = property(dim)


def check_graph(g, what: str) -> None:
    """TypeError unless ``g`` is a DistGraph: what every op and layer checks first."""
    if not isinstance(g, DistGraph):
        raise ArgumentTypeError(
            f"{what}: the graph argument g must be the job's DistGraph, got "
            f"{type(g).__name__}: mgg layers run inside an mgg job (mgg.train.prepare or "
            "DistGraph.build makes it; a PyG script's data.g)"
        )


def check_rows(x, g, what: str) -> None:
    """Clear errors for the tensors a layer gets: this rank's rows, on the job's device."""
    check_graph(g, what)
    if not isinstance(x, torch.Tensor | InputRows) or not x.shape:
        raise ArgumentTypeError(
            f"{what}: x must be a tensor of this rank's rows (or InputRows), got {type(x).__name__}"
        )
    if x.shape[0] != g.num_local_nodes:
        raise InputError(
            f"{what}: the input has {x.shape[0]} rows but rank {g.rank} owns "
            f"{g.num_local_nodes} nodes [{g.lb}, {g.ub})"
        )
    check_device(x, g, what, "the input")


def check_tensor(
    t, g, name: str, shape: str, ndims: tuple, dtype=None, who: str = "aggregate"
) -> None:
    """InputError unless ``t`` is a tensor ``shape`` (of ``ndims`` dimensions) in
    ``dtype`` (default the job's)."""
    want = torch_dtype(g.dtype if dtype is None else dtype)
    if isinstance(t, InputRows):
        raise ArgumentTypeError(
            f"{who}: {name} is {t.what} ({type(t).__name__} {tuple(t.shape)}), which {who} "
            f"cannot take: pass a {want} tensor {shape}; apply a linear layer first "
            f"(nn.Linear, mgg.torch.linear), or {name}.to_dense()"
        )
    if not isinstance(t, torch.Tensor) or t.ndim not in ndims:
        got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"{who}: {name} must be a {want} tensor {shape}, got {got}")
    if t.dtype != want:
        raise InputError(
            f"{who}: {name} is {t.dtype} but this job aggregates {want} (the DistGraph's "
            f"dtype): pass {name}.to({want}), or build the DistGraph with that dtype "
            "(float32 or bfloat16; the cpu backend also float64)"
        )


def rows_in(x, g, what: str):
    """x checked as this rank's rows [n, D] in the job's dtype (float32 rounded to bf16
    in a bfloat16 job)."""
    check_rows(x, g, what)
    if is_bf16(g.dtype) and isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        x = x.to(torch.bfloat16)
    check_tensor(x, g, "x", "[n, D]", (2,))
    return x


def check_features(x, g, who: str, width: int | None = None, name: str = "x") -> None:
    """A layer's input where it enters (after the graph): this rank's rows [n, width] (a
    tensor, or InputRows), on the job's device, in the job's dtype (float32 too in a
    bfloat16 job). InputError naming ``who``, ``name``, what was expected and what came."""
    check_graph(g, who)
    n = g.num_local_nodes
    if (
        type(x) is torch.Tensor  # the common case, in a few attribute reads
        and x.ndim == 2
        and x.shape[0] == n
        and (width is None or x.shape[1] == width)
        and x.is_cuda == g.backend.gpu
        and x.dtype in job_dtypes(g)
    ):
        return
    want = f"[{n}, {'D' if width is None else width}]"
    if not isinstance(x, torch.Tensor | InputRows):
        raise ArgumentTypeError(
            f"{who}: {name} must be a tensor of this rank's rows {want} (or InputRows), got "
            f"{type(x).__name__}"
        )
    if x.ndim != 2:
        raise InputError(
            f"{who}: {name} must be this rank's rows {want}, got shape {tuple(x.shape)}"
        )
    if x.shape[0] != n:
        raise InputError(
            f"{who}: {name} has {x.shape[0]} rows but rank {g.rank} owns {n} nodes "
            f"[{g.lb}, {g.ub}): {name} must be {want}"
        )
    if width is not None and x.shape[1] != width:
        raise InputError(
            f"{who}: {name} has {x.shape[1]} columns but the layer takes {width} "
            f"(in_channels): {name} must be {want}, got {tuple(x.shape)}"
        )
    check_device(x, g, who, name)
    if isinstance(x, torch.Tensor):
        check_row_dtype(x, g, who, name)


def check_device(t, g, who: str, name: str) -> None:
    """InputError unless tensor ``t`` is on the job's kind of device."""
    if (t.device.type == "cuda") != g.backend.gpu:
        raise InputError(
            f"{who}: {name} is on {t.device} but the job runs on the {g.backend.name} backend"
        )


def job_dtypes(g) -> tuple:
    """The dtypes rows of g's job may have: its dtype (and float32 in a bfloat16 job)."""
    return _row_dtypes(g.dtype)


@functools.cache
def _row_dtypes(dtype) -> tuple:
    want = torch_dtype(dtype)
    return (want, torch.float32) if want == torch.bfloat16 else (want,)


@functools.cache
def _output_dtypes(dtype) -> tuple:
    """What a message or an aggregate may return: the rows' dtypes or the sums'."""
    return (*_row_dtypes(dtype), torch_dtype(accumulator(dtype)))


def check_row_dtype(t: torch.Tensor, g, who: str, name: str, extra: tuple = ()) -> None:
    """InputError unless tensor ``t`` has one of the job's row dtypes (or ``extra``)."""
    ok = job_dtypes(g) + tuple(extra)
    if t.dtype not in ok:
        raise InputError(
            f"{who}: {name} is {t.dtype} but this job computes in {ok[0]} (the DistGraph's "
            f"dtype): pass {name}.to({ok[0]}), or build the DistGraph with dtype {t.dtype}"
        )


def check_edge_values(
    t, g, who: str, name: str, ndims=(1, 2), edges: int | None = None, floating: bool = True
):
    """InputError unless ``t`` is a float tensor [E] or [E, ...] (ndims) over the E edges
    of ``edge_index(g)`` (``edges``: another count) on the job's device."""
    e = g.plan.num_local_edges + g.plan.num_remote_edges if edges is None else edges
    ndims = tuple(ndims)
    shape = f"[{e}]" if ndims == (1,) else f"[{e}] or [{e}, ...]"
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(
            f"{who}: {name} must be a float tensor {shape} over this rank's {e} edges "
            f"(edge_index(g)'s order), got {type(t).__name__}"
        )
    if t.ndim not in ndims or t.shape[0] != e:
        raise InputError(
            f"{who}: {name} must be {shape} over this rank's {e} edges (edge_index(g)'s "
            f"order, local then remote), got shape {tuple(t.shape)}"
        )
    if floating and not t.is_floating_point():
        raise InputError(f"{who}: {name} must be a float tensor {shape}, got {t.dtype}")
    check_device(t, g, who, name)


def check_output(t, g, who: str, rows: int, of: str, dtypes=None) -> None:
    """What a user's method returned (``who``: the method): a tensor [rows, ...] (one row
    for each of the rank's ``of``, "edges" or "nodes"), at least 2-D (nodes in dim 0, as
    PyG's node_dim -2), of a float dtype in ``dtypes`` (default: the job's, or its
    accumulator's). The message's text is made only when it fails."""
    ok = _output_dtypes(g.dtype) if dtypes is None else dtypes
    if isinstance(t, torch.Tensor) and t.ndim >= 2 and t.shape[0] == rows and t.dtype in ok:
        return
    what = f"[{rows}, ...] for the {rows} {of} of rank {g.rank}"
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{who} must return a float tensor {what}, got {_got(t)}")
    if t.ndim < 2 or t.shape[0] != rows:
        flat = " (at least 2-D, as PyG's: a 1-D one is t.view(-1, 1))" if t.ndim < 2 else ""
        raise InputError(f"{who} must return a tensor {what}{flat}, got shape {tuple(t.shape)}")
    if t.dtype not in ok:
        names = ", ".join(sorted({str(d) for d in ok}))
        raise InputError(f"{who} must return {names} rows {what}, got {t.dtype}")
