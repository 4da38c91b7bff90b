"""What the layers share: PyG's weight initialization, the refusal of settings mgg does
not take, and the width a layer aggregates at (the narrower, or PyG's: ``pyg_widths``)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from ...errors import InputError
from ..checks import InputRows

WITH_LOOPS = ("self_loops", "gcn_norm")  # the graph kinds with one self loop per node


def glorot(t: torch.Tensor) -> None:
    """PyG's glorot: t uniform in ±sqrt(6 / (fan_in + fan_out)) of its last two dims."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


def refuse(what: str, why: str):
    raise InputError(f"{what}: {why}")


def narrower(layer: nn.Module, x, out_dim: int, pyg: bool) -> bool:
    """Whether ``layer`` transforms x before aggregating: x is InputRows (sparse, or
    streamed); else, with the layer's ``pyg_order`` (pyg_widths), PyG's order ``pyg``;
    else when the output [n, out_dim] is narrower than x."""
    if isinstance(x, InputRows):
        return True
    return pyg if layer.pyg_order else out_dim < x.shape[1]


@contextlib.contextmanager
def pyg_widths(model: nn.Module):
    """Inside, the layers of ``model`` (a layer, or a model of them) aggregate at the width
    their PyG twins do (GCN after its Linear, SAGE and GIN before it) instead of the
    narrower one: the same function, computed in PyG's order, so a benchmark can tell
    mgg's algebra from its kernels. It sets each module's ``pyg_order`` (the layers',
    and a Model's, which then reads no input a chunk at a time), and restores it."""
    ordered = [m for m in model.modules() if hasattr(m, "pyg_order")]
    before = [m.pyg_order for m in ordered]
    for m in ordered:
        m.pyg_order = True
    try:
        yield model
    finally:
        for m, b in zip(ordered, before, strict=True):
            m.pyg_order = b
