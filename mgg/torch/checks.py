"""What every op and layer checks first, with errors that name the problem: the graph is
the job's DistGraph, x is this rank's rows (a tensor, or InputRows: input features in a
form no tensor op takes, whose containers are mgg.torch.inputs'), a tensor has the
job's dtype and shape."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distgraph import DistGraph
from ..errors import InputError
from ..precision import is_bf16, torch_dtype


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
        raise TypeError(
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
        raise TypeError(
            f"{what}: the graph argument g must be the job's DistGraph, got "
            f"{type(g).__name__}: mgg layers run inside an mgg job (mgg.train.prepare or "
            "DistGraph.build makes it; a PyG script's data.g)"
        )


def check_rows(x, g, what: str) -> None:
    """Clear errors for the tensors a layer gets: this rank's rows, on the job's device."""
    check_graph(g, what)
    if not isinstance(x, torch.Tensor | InputRows) or not x.shape:
        raise TypeError(
            f"{what}: x must be a tensor of this rank's rows (or InputRows), got {type(x).__name__}"
        )
    if x.shape[0] != g.num_local_nodes:
        raise ValueError(
            f"{what}: the input has {x.shape[0]} rows but rank {g.rank} owns "
            f"{g.num_local_nodes} nodes [{g.lb}, {g.ub})"
        )
    if (x.device.type == "cuda") != g.backend.gpu:
        raise ValueError(
            f"{what}: the input is on {x.device} but the job runs on the {g.backend.name} backend"
        )


def check_tensor(t, g, name: str, shape: str, ndims: tuple, dtype=None) -> None:
    """InputError unless ``t`` is a tensor ``shape`` (of ``ndims`` dimensions) in
    ``dtype`` (default the job's)."""
    want = torch_dtype(g.dtype if dtype is None else dtype)
    if not isinstance(t, torch.Tensor) or t.ndim not in ndims:
        got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"aggregate: {name} must be a {want} tensor {shape}, got {got}")
    if t.dtype != want:
        raise InputError(
            f"aggregate: {name} is {t.dtype} but this job aggregates {want} (the DistGraph's "
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
